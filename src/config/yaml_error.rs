//! YAML errors as an operator reads them: the parser's own wording, except where it speaks
//! to the programmer using it (a duplicate key names a parser option an operator cannot set).

use std::borrow::Cow;

use serde_saphyr::{DefaultMessageFormatter, Error, MessageFormatter};

/// The message of `e`, with its location and snippet, in the operator's terms.
pub(super) fn describe(e: &Error) -> String {
    e.render_with_formatter(&ForOperators)
}

struct ForOperators;

impl MessageFormatter for ForOperators {
    fn format_message<'a>(&self, err: &'a Error) -> Cow<'a, str> {
        match err {
            Error::DuplicateMappingKey { key: Some(key), .. } => Cow::Owned(format!(
                "the key {key} appears twice in one map (upstream silently keeps the last one); keep one"
            )),
            Error::DuplicateMappingKey { key: None, .. } => {
                Cow::Borrowed("a key appears twice in one map (upstream silently keeps the last one); keep one")
            }
            _ => DefaultMessageFormatter.format_message(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duplicate_key_is_named_without_the_parsers_options() {
        let e = serde_saphyr::from_str::<serde_json::Value>("a:\n  hostDir: /x\n  hostDir: /y\n").unwrap_err();
        let text = describe(&e);
        assert!(text.contains("the key hostDir appears twice in one map"), "{text}");
        assert!(text.contains("line 3"), "{text}");
        assert!(!text.contains("DuplicateKeyPolicy"), "{text}");
        assert!(!text.contains("Options"), "{text}");
    }

    #[test]
    fn other_errors_keep_the_parsers_wording() {
        let e = serde_saphyr::from_str::<serde_json::Value>("a: [1, 2\n").unwrap_err();
        assert_eq!(describe(&e), e.to_string());
    }
}
