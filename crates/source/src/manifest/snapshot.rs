//! One reading of the manifest directory, and the changes between two readings.
//!
//! The directory is read non-recursively, like `kubectl apply -f DIR` without `-R`: every regular
//! file (symlinks followed) named `*.yaml`, `*.yml` or `*.json`, in byte order of the file name.
//! Hidden entries (a leading `.`) are skipped: editors' swap files, and the `..data` machinery of
//! a mounted ConfigMap, whose visible files are symlinks into it.
//!
//! Bad input never takes down what works: when a file that loaded before now has errors (or cannot
//! be read), the objects its last version defined that the new version no longer yields *stay*,
//! until the file is fixed or deleted. Deleting a file deletes its objects.
//!
//! Each object is held once (shared between its file's entry and the merged view), and a file's
//! bytes are remembered only as a digest: what is kept is what the diff needs, nothing more.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kproxy_state::{Change, Kind, Object, ObjectKey};

use super::decode::{Decoded, decode_document};
use super::documents::{self, Format};
use super::error::{ManifestError, SourceError};

/// Where an object was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The file.
    pub file: PathBuf,
    /// The 1-based line its definition starts on.
    pub line: usize,
}

#[derive(Debug, Clone)]
struct Located {
    object: Arc<Object>,
    origin: Origin,
}

/// A file's length and 64-bit digest: enough to tell an unchanged file without keeping its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Digest(usize, u64);

impl Digest {
    fn of(content: &[u8]) -> Self {
        let mut hasher = DefaultHasher::new();
        content.hash(&mut hasher);
        Digest(content.len(), hasher.finish())
    }
}

/// What one file contributed.
#[derive(Debug, Clone)]
struct FileEntry {
    /// What was parsed, to skip re-parsing an unchanged file.
    content: Option<Digest>,
    /// Objects in file order: those it yields now, then those kept from an earlier version.
    objects: Vec<Located>,
    errors: Vec<ManifestError>,
}

/// The objects of a manifest directory at one moment, and what was skipped.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    dir: PathBuf,
    files: BTreeMap<PathBuf, FileEntry>,
    objects: BTreeMap<(Kind, ObjectKey), Located>,
    errors: Vec<ManifestError>,
}

/// Reads a manifest directory. Only an unreadable directory is an error; bad files, documents
/// and objects are skipped and listed in [`Snapshot::errors`].
pub fn load(dir: &Path) -> Result<Snapshot, SourceError> {
    Snapshot { dir: dir.to_path_buf(), ..Snapshot::default() }.reload()
}

/// The changes a consumer needs first, kind by kind in [`Kind::ALL`] order: every object as
/// `Applied`, then `Synced`. Produced one at a time, so sending them never copies the whole
/// directory at once.
pub fn initial_changes(snapshot: &Snapshot) -> impl Iterator<Item = Change> + '_ {
    Kind::ALL.into_iter().flat_map(move |kind| {
        let objects = snapshot.objects_of(kind).map(|object| Change::Applied(object.clone()));
        objects.chain(std::iter::once(Change::Synced(kind)))
    })
}

impl Snapshot {
    /// The directory this snapshot was read from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every object, ordered by kind, namespace and name.
    pub fn objects(&self) -> impl Iterator<Item = &Object> {
        self.objects.values().map(|l| &*l.object)
    }

    /// The objects of one kind, ordered by namespace and name.
    pub fn objects_of(&self, kind: Kind) -> impl Iterator<Item = &Object> {
        self.objects
            .range((kind, ObjectKey::default())..)
            .take_while(move |((k, _), _)| *k == kind)
            .map(|(_, l)| &*l.object)
    }

    /// Number of objects.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// True when no object was read.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// One object.
    pub fn get(&self, kind: Kind, key: &ObjectKey) -> Option<&Object> {
        self.objects.get(&(kind, key.clone())).map(|l| &*l.object)
    }

    /// Where an object was defined.
    pub fn origin(&self, kind: Kind, key: &ObjectKey) -> Option<&Origin> {
        self.objects.get(&(kind, key.clone())).map(|l| &l.origin)
    }

    /// Everything that was skipped, ordered by file and line.
    pub fn errors(&self) -> &[ManifestError] {
        &self.errors
    }

    /// See [`initial_changes`].
    pub fn initial_changes(&self) -> impl Iterator<Item = Change> + '_ {
        initial_changes(self)
    }

    /// Reads the directory again. Files whose bytes did not change are not parsed again; files
    /// that now have errors keep their earlier objects (see the module documentation).
    pub fn reload(&self) -> Result<Snapshot, SourceError> {
        Ok(self.reload_if_changed()?.unwrap_or_else(|| self.clone()))
    }

    /// Like [`Snapshot::reload`], but `None` when no file was added, removed or changed, which
    /// costs only the reads: this is what makes polling cheap.
    pub fn reload_if_changed(&self) -> Result<Option<Snapshot>, SourceError> {
        let mut changed = false;
        let mut files = BTreeMap::new();
        for path in manifest_files(&self.dir)? {
            let previous = self.files.get(&path);
            let content = match std::fs::read(&path) {
                Ok(content) => Ok(content),
                // Gone between listing and reading: the file is deleted.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => Err(e),
            };
            let entry = match (content, previous) {
                (Ok(content), Some(previous)) if previous.content == Some(Digest::of(&content)) => previous.clone(),
                (Ok(content), _) => {
                    changed = true;
                    let (objects, errors) = parse_file(&path, &content);
                    FileEntry { content: Some(Digest::of(&content)), objects, errors }
                }
                (Err(e), _) => {
                    let error = ManifestError::new(&path, None, format!("cannot read: {e}"));
                    changed |= previous.is_none_or(|p| p.errors != [error.clone()]);
                    FileEntry { content: None, objects: Vec::new(), errors: vec![error] }
                }
            };
            files.insert(path, keep_last_good(entry, previous));
        }
        changed |= !files.keys().eq(self.files.keys());
        Ok(changed.then(|| merge(self.dir.clone(), files)))
    }

    /// The events that turn `older` into `self`: `Applied` for new and changed objects (in
    /// [`Kind::ALL`] order), then `Deleted` for removed ones (in reverse order, so endpoints go
    /// before their services).
    pub fn changes_since(&self, older: &Snapshot) -> Vec<Change> {
        let mut changes = Vec::new();
        for kind in Kind::ALL {
            for ((k, key), new) in
                self.objects.range((kind, ObjectKey::default())..).take_while(|((k, _), _)| *k == kind)
            {
                if older.objects.get(&(*k, key.clone())).is_none_or(|old| old.object != new.object) {
                    changes.push(Change::Applied(Object::clone(&new.object)));
                }
            }
        }
        for kind in Kind::ALL.into_iter().rev() {
            for ((k, key), _) in
                older.objects.range((kind, ObjectKey::default())..).take_while(|((k, _), _)| *k == kind)
            {
                if !self.objects.contains_key(&(*k, key.clone())) {
                    changes.push(Change::Deleted(*k, key.clone()));
                }
            }
        }
        changes
    }
}

/// The manifest files of a directory, sorted.
fn manifest_files(dir: &Path) -> Result<Vec<PathBuf>, SourceError> {
    let read_dir_error = |source| SourceError::ReadDir { dir: dir.to_path_buf(), source };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read_dir_error)? {
        let entry = entry.map_err(read_dir_error)?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with('.') || format_of(Path::new(name)).is_none() {
            continue;
        }
        let path = entry.path();
        // Follows symlinks; a dangling one is kept so that reading it reports the problem.
        if std::fs::metadata(&path).map(|m| m.is_file()).unwrap_or(true) {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

fn format_of(path: &Path) -> Option<Format> {
    match path.extension()?.to_str()?.to_ascii_lowercase().as_str() {
        "yaml" | "yml" => Some(Format::Yaml),
        "json" => Some(Format::Json),
        _ => None,
    }
}

fn parse_file(path: &Path, content: &[u8]) -> (Vec<Located>, Vec<ManifestError>) {
    let text = match std::str::from_utf8(content) {
        Ok(text) => text,
        Err(e) => {
            let line = content[..e.valid_up_to()].iter().filter(|&&b| b == b'\n').count() + 1;
            return (Vec::new(), vec![ManifestError::new(path, Some(line), "not valid UTF-8")]);
        }
    };
    let format = format_of(path).unwrap_or(Format::Yaml);
    let (docs, syntax_errors) = documents::parse(text, format);
    let mut errors: Vec<ManifestError> =
        syntax_errors.into_iter().map(|e| ManifestError::new(path, Some(e.line), e.message)).collect();
    let mut decoded = Vec::new();
    for doc in docs {
        decode_document(path, doc, &mut decoded, &mut errors);
    }
    let objects = decoded
        .into_iter()
        .map(|Decoded { object, line }| Located {
            object: Arc::new(object),
            origin: Origin { file: path.to_path_buf(), line },
        })
        .collect();
    (objects, errors)
}

/// A file with errors keeps the objects of its previous version that it no longer yields.
fn keep_last_good(mut entry: FileEntry, previous: Option<&FileEntry>) -> FileEntry {
    let Some(previous) = previous.filter(|_| !entry.errors.is_empty()) else { return entry };
    let yielded: std::collections::BTreeSet<(Kind, ObjectKey)> =
        entry.objects.iter().map(|l| (l.object.kind(), l.object.key())).collect();
    let kept: Vec<Located> =
        previous.objects.iter().filter(|l| !yielded.contains(&(l.object.kind(), l.object.key()))).cloned().collect();
    if !kept.is_empty() {
        if let Some(file) = entry.errors.first().map(|e| e.file.display().to_string()) {
            tracing::warn!(file, kept = kept.len(), "file has errors: keeping the objects of its last good version");
        }
        entry.objects.extend(kept);
    }
    entry
}

/// Merges the files in order: the first definition of an object wins, later ones are errors.
fn merge(dir: PathBuf, files: BTreeMap<PathBuf, FileEntry>) -> Snapshot {
    let mut objects: BTreeMap<(Kind, ObjectKey), Located> = BTreeMap::new();
    let mut errors = Vec::new();
    for entry in files.values() {
        errors.extend(entry.errors.iter().cloned());
        for located in &entry.objects {
            let kind = located.object.kind();
            let key = located.object.key();
            match objects.entry((kind, key.clone())) {
                Entry::Vacant(slot) => {
                    slot.insert(located.clone());
                }
                Entry::Occupied(first) => {
                    let first = &first.get().origin;
                    errors.push(ManifestError {
                        file: located.origin.file.clone(),
                        line: Some(located.origin.line),
                        kind: Some(kind.to_string()),
                        name: Some(key.to_string()),
                        message: format!(
                            "duplicate: already defined at {}:{}; this definition is ignored",
                            first.file.display(),
                            first.line
                        ),
                    });
                }
            }
        }
    }
    errors.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    Snapshot { dir, files, objects, errors }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kproxy-snapshot-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn each_object_is_held_once_and_files_only_as_digests() {
        let dir = scratch("once");
        let service = |name: &str, ip: &str| {
            format!(
                "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\nspec:\n  clusterIP: {ip}\n  ports:\n  - port: 80\n"
            )
        };
        std::fs::write(dir.join("a.yaml"), service("a", "198.18.128.1")).unwrap();
        std::fs::write(dir.join("b.yaml"), service("b", "198.18.128.2")).unwrap();
        let first = load(&dir).unwrap();
        assert_eq!(first.len(), 2);
        // One copy, shared by the file's entry and the merged view.
        for located in first.objects.values() {
            assert_eq!(Arc::strong_count(&located.object), 2, "{:?}", located.object.key());
        }
        let digest = first.files.get(&dir.join("a.yaml")).and_then(|f| f.content);
        assert_eq!(digest, Some(Digest::of(service("a", "198.18.128.1").as_bytes())));

        // A re-read of an unchanged file reuses its objects; a changed file is parsed again.
        std::fs::write(dir.join("b.yaml"), service("b", "198.18.128.3")).unwrap();
        let second = first.reload().unwrap();
        let a =
            |s: &Snapshot| s.objects.get(&(Kind::Service, ObjectKey::new("default", "a"))).map(|l| l.object.clone());
        assert!(a(&first).zip(a(&second)).is_some_and(|(x, y)| Arc::ptr_eq(&x, &y)), "unchanged file not re-parsed");
        let changes: Vec<String> = second.changes_since(&first).iter().map(|c| c.kind().to_string()).collect();
        assert_eq!(changes, ["Service"], "only b changed");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
