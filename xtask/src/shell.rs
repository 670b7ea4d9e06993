//! POSIX shell quoting for the scripts the guest runs.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

/// `value` as one single-quoted shell word; works for any bytes except NUL.
pub fn quote(value: impl AsRef<OsStr>) -> Vec<u8> {
    let mut quoted = vec![b'\''];
    for &byte in value.as_ref().as_bytes() {
        if byte == b'\'' {
            quoted.extend_from_slice(b"'\\''");
        } else {
            quoted.push(byte);
        }
    }
    quoted.push(b'\'');
    quoted
}

/// Whether `name` can be exported by a POSIX shell.
pub fn is_variable_name(name: &OsStr) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && !bytes[0].is_ascii_digit()
        && bytes.iter().all(|byte| byte.is_ascii_alphanumeric() || *byte == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_single_quotes_and_keeps_everything_else() {
        assert_eq!(quote("it's $HOME"), b"'it'\\''s $HOME'".to_vec());
        assert_eq!(quote(""), b"''".to_vec());
    }

    #[test]
    fn recognises_exportable_names() {
        assert!(is_variable_name(OsStr::new("KPROXY_GUEST")));
        assert!(!is_variable_name(OsStr::new("1X")));
        assert!(!is_variable_name(OsStr::new("A-B")));
        assert!(!is_variable_name(OsStr::new("")));
    }
}
