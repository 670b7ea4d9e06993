//! Splitting a file into documents, each parsed on its own into a `serde_json::Value`.
//!
//! A YAML file is cut at its `---` / `...` markers *before* parsing, so a syntax error in one
//! document does not hide the others, and every document knows the line it starts on. Cutting at
//! column-0 markers is exact: the YAML spec forbids document markers at the start of a line inside
//! content, block scalars included. A JSON file is a stream of values (`kubectl` accepts several).

use serde_json::Value;
use serde_saphyr::MessageFormatter;

/// How a document's text is parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Yaml,
    Json,
}

/// One document of a file.
#[derive(Debug, Clone)]
pub(crate) struct Document<'a> {
    /// The document's text, exactly as handed to the parser.
    pub text: &'a str,
    pub format: Format,
    /// 1-based file line of the first line of `text`.
    pub first_line: usize,
    /// 1-based file line of the document's first meaningful line: where errors point by default.
    pub line: usize,
}

impl Document<'_> {
    /// Translates a 1-based line within `text` into a file line.
    pub fn file_line(&self, line_in_text: usize) -> usize {
        self.first_line + line_in_text.saturating_sub(1)
    }
}

/// A document that parsed, with its value.
#[derive(Debug)]
pub(crate) struct ParsedDocument<'a> {
    pub doc: Document<'a>,
    pub value: Value,
}

/// A document (or the rest of a file) that did not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SyntaxError {
    pub line: usize,
    pub message: String,
}

/// Parses every document of a file. Empty documents (comments only, a trailing `---`) are dropped.
pub(crate) fn parse(text: &str, format: Format) -> (Vec<ParsedDocument<'_>>, Vec<SyntaxError>) {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    match format {
        Format::Yaml => parse_yaml(text),
        Format::Json => parse_json(text),
    }
}

fn parse_yaml(text: &str) -> (Vec<ParsedDocument<'_>>, Vec<SyntaxError>) {
    let mut parsed = Vec::new();
    let mut errors = Vec::new();
    for doc in split_yaml(text) {
        match serde_saphyr::from_str::<Value>(doc.text) {
            Ok(Value::Null) => {}
            Ok(value) => parsed.push(ParsedDocument { doc, value }),
            Err(e) => {
                let line = e.location().map(|l| doc.file_line(l.line() as usize)).unwrap_or(doc.line);
                errors.push(SyntaxError { line, message: yaml_message(&e) });
            }
        }
    }
    (parsed, errors)
}

/// The message of a serde-saphyr error without its location suffix or snippet (the caller
/// reports file and line itself), on one line.
pub(crate) fn yaml_message(e: &serde_saphyr::Error) -> String {
    let message = serde_saphyr::UserMessageFormatter.format_message(e.without_snippet());
    message.chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
}

/// Cuts YAML text into documents at column-0 `---` (starts one) and `...` (ends one) markers.
fn split_yaml<'a>(text: &'a str) -> Vec<Document<'a>> {
    let mut docs: Vec<Document<'a>> = Vec::new();
    let mut start = 0; // byte offset of the current document
    let mut start_line = 1;
    let mut offset = 0;
    let push = |docs: &mut Vec<Document<'a>>, from: usize, to: usize, first_line: usize| {
        let chunk = &text[from..to];
        if let Some(line) = first_meaningful_line(chunk) {
            docs.push(Document { text: chunk, format: Format::Yaml, first_line, line: first_line + line });
        }
    };
    for (index, raw_line) in text.split_inclusive('\n').enumerate() {
        let line_no = index + 1;
        let line = raw_line.trim_end_matches(['\n', '\r']);
        if is_marker(line, "---") {
            push(&mut docs, start, offset, start_line);
            start = offset;
            start_line = line_no;
        } else if is_marker(line, "...") {
            push(&mut docs, start, offset + raw_line.len(), start_line);
            start = offset + raw_line.len();
            start_line = line_no + 1;
        }
        offset += raw_line.len();
    }
    push(&mut docs, start, text.len(), start_line);
    docs
}

fn is_marker(line: &str, marker: &str) -> bool {
    line.strip_prefix(marker).is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t']))
}

/// The 0-based index of the first line of a chunk that holds content, or `None` when the chunk is
/// only blank lines, comments, directives and bare markers.
fn first_meaningful_line(chunk: &str) -> Option<usize> {
    chunk.lines().position(|line| {
        let rest = line.strip_prefix("---").filter(|_| is_marker(line, "---")).unwrap_or(line).trim();
        !(rest.is_empty() || rest.starts_with('#') || line.starts_with('%') || is_marker(line, "..."))
    })
}

fn parse_json(text: &str) -> (Vec<ParsedDocument<'_>>, Vec<SyntaxError>) {
    let lines = LineIndex::new(text);
    let mut parsed = Vec::new();
    let mut errors = Vec::new();
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    let mut end = 0;
    loop {
        let value = match stream.next() {
            None => break,
            Some(Ok(value)) => value,
            Some(Err(e)) => {
                // The stream cannot resynchronize after a syntax error: the rest of the file is lost.
                errors.push(SyntaxError { line: e.line().max(1), message: json_message(&e) });
                break;
            }
        };
        let previous_end = end;
        end = stream.byte_offset();
        let raw = &text[previous_end..end];
        let start = previous_end + (raw.len() - raw.trim_start().len());
        let first_line = lines.line_of(start);
        let doc = Document { text: &text[start..end], format: Format::Json, first_line, line: first_line };
        if !value.is_null() {
            parsed.push(ParsedDocument { doc, value });
        }
    }
    (parsed, errors)
}

/// A serde_json error's message without its " at line L column C" suffix.
pub(crate) fn json_message(e: &serde_json::Error) -> String {
    let message = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    message.strip_suffix(&suffix).map(str::to_owned).unwrap_or(message)
}

/// Byte offset → 1-based line.
struct LineIndex {
    starts: Vec<usize>,
}

impl LineIndex {
    fn new(text: &str) -> Self {
        let starts = std::iter::once(0).chain(text.match_indices('\n').map(|(i, _)| i + 1)).collect();
        Self { starts }
    }

    fn line_of(&self, offset: usize) -> usize {
        self.starts.partition_point(|&s| s <= offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_of(text: &str) -> Vec<usize> {
        parse(text, Format::Yaml).0.iter().map(|d| d.doc.line).collect()
    }

    #[test]
    fn documents_know_their_first_content_line() {
        let text = "# header\na: 1\n---\n# comment\n\nb: 2\n--- # trailing\n---\n...\nc: 3\n---\n";
        assert_eq!(lines_of(text), vec![2, 6, 10]);
    }

    #[test]
    fn content_on_the_marker_line_counts() {
        assert_eq!(lines_of("--- {a: 1}\n--- {b: 2}\n"), vec![1, 2]);
    }

    #[test]
    fn a_syntax_error_names_its_file_line_and_spares_other_documents() {
        let (docs, errors) = parse("a: 1\n---\nb: [1,\n\n---\nc: 3\n", Format::Yaml);
        assert_eq!(docs.len(), 2);
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].line, 3, "{errors:?}");
        assert!(!errors[0].message.contains("line"), "location is reported separately: {:?}", errors[0].message);
    }

    #[test]
    fn json_streams_and_their_lines() {
        let (docs, errors) = parse("{\"a\": 1}\n\n  {\"b\":\n 2}\n", Format::Json);
        assert!(errors.is_empty());
        assert_eq!(docs.iter().map(|d| d.doc.line).collect::<Vec<_>>(), vec![1, 3]);
        assert_eq!(docs[1].doc.text, "{\"b\":\n 2}");
        let (docs, errors) = parse("{\"a\": 1}\n{\"b\": ,}\n", Format::Json);
        assert_eq!(docs.len(), 1);
        assert_eq!(errors, vec![SyntaxError { line: 2, message: errors[0].message.clone() }]);
        assert!(!errors[0].message.contains("line 2"));
    }

    #[test]
    fn a_byte_order_mark_is_ignored() {
        let (docs, errors) = parse("\u{feff}a: 1\n", Format::Yaml);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(docs[0].value, serde_json::json!({"a": 1}));
    }
}
