//! Parsing untrusted history files: errors name the line, nothing panics.

mod common;

use ambidex_history::{format::to_line, parse_reader, parse_str, Outcome, WriteKind};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const GOOD: &str = r#"{"id": 4294967301, "node": 0, "thread": 1, "outcome": "committed", "reason": null, "start_us": 12, "end_us": 40, "reads": [{"table": 1, "key": 5, "version": 77, "value": "0a0b0c"}], "writes": [{"table": 1, "key": 5, "kind": "update", "prev_version": 77, "version": 4294967301, "value": "0a0b0d"}]}"#;

#[test]
fn parses_the_documented_example() {
    let recs = parse_str(&format!("{GOOD}\n\n")).unwrap();
    assert_eq!(recs.len(), 1);
    let r = &recs[0];
    assert_eq!(
        (r.id, r.outcome, r.reads[0].version),
        (4294967301, Outcome::Committed, 77)
    );
    assert_eq!(r.writes[0].kind, WriteKind::Update);
    // Round trip through our own serializer.
    assert_eq!(parse_str(&to_line(r)).unwrap()[0], *r);
}

#[test]
fn malformed_lines_name_the_line() {
    let cases: &[(&str, &str)] = &[
        ("{not json", "key must be a string"),
        (r#"{"id": 5}"#, "missing field"),
        (
            &GOOD.replace("\"committed\"", "\"maybe\""),
            "unknown variant",
        ),
        (&GOOD.replace("\"update\"", "\"upsert\""), "unknown variant"),
        (&GOOD.replace("\"0a0b0c\"", "\"0a0\""), "odd number"),
        (&GOOD.replace("\"0a0b0c\"", "\"zz\""), "not hex"),
        (
            &GOOD.replace("\"version\": 4294967301", "\"version\": 9"),
            "not the transaction id",
        ),
        (
            &GOOD.replace("\"id\": 4294967301", "\"id\": 0"),
            "out of range",
        ),
        (
            &GOOD.replace("\"key\": 5, \"version\"", "\"key\": -5, \"version\""),
            "invalid value",
        ),
        (
            &GOOD.replace("\"kind\": \"update\"", "\"kind\": \"delete\""),
            "delete must have value null",
        ),
        (&GOOD.replace("\"0a0b0d\"", "null"), "must have a value"),
        (
            &GOOD.replace("\"version\": 77", "\"version\": 9223372036854775808"),
            ">= 2^63",
        ),
        ("[1,2,3]", "invalid length"),
        ("\"str\"", "invalid type"),
    ];
    for (line, want) in cases {
        let text = format!("{GOOD}\n{GOOD}\n{line}\n{GOOD}\n");
        let err = parse_str(&text).unwrap_err();
        assert_eq!(err.line, 3, "{line}: {err}");
        assert!(err.to_string().starts_with("line 3: "), "{err}");
        assert!(
            err.message.contains(want),
            "{line}: got {err}, want {want:?}"
        );
    }
}

#[test]
fn invalid_utf8_is_an_error_not_a_panic() {
    let mut bytes = format!("{GOOD}\n").into_bytes();
    bytes.extend_from_slice(b"{\"id\": \xff}\n");
    let err = parse_reader(&bytes[..]).unwrap_err();
    assert_eq!(err.line, 2, "{err}");
}

#[test]
fn random_garbage_never_panics() {
    let mut rng = SmallRng::seed_from_u64(1);
    let good = GOOD.as_bytes();
    for _ in 0..3000 {
        let mut b = good.to_vec();
        for _ in 0..rng.gen_range(1..4) {
            if b.is_empty() {
                break;
            }
            let i = rng.gen_range(0..b.len());
            match rng.gen_range(0..3) {
                0 => b[i] = rng.gen(),
                1 => {
                    b.remove(i);
                }
                _ => b.truncate(i),
            }
        }
        // Ok or Err are both fine; a panic fails the test.
        let _ = parse_reader(&b[..]);
        if let Ok(s) = std::str::from_utf8(&b) {
            if let Ok(recs) = parse_str(s) {
                let _ = ambidex_history::check(&recs);
            }
        }
    }
}
