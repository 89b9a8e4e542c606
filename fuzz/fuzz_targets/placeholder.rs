//! The placeholder parser (`model::placeholder::parse_string`) in both dialects, on any text.
//! Besides not panicking, an error must point inside the string: its column is where a user
//! is sent to look.

#![no_main]

use gitplane::model::placeholder::{Dialect, parse_string};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let chars = text.chars().count();
    for dialect in [Dialect::Definition, Dialect::Score] {
        if let Err(e) = parse_string(text, dialect) {
            assert!(
                e.column >= 1 && e.column <= chars.max(1),
                "column {} outside a string of {chars} characters: {}",
                e.column,
                e.reason
            );
            assert!(!e.reason.is_empty());
        }
    }
});
