//! `--export-json`: the [`RunRecord`] as pretty JSON with real booleans and numbers.

use crate::run::RunRecord;
use std::io;

pub fn render(run: &RunRecord) -> io::Result<Vec<u8>> {
    let mut v = serde_json::to_vec_pretty(run).map_err(io::Error::other)?;
    v.push(b'\n');
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::super::sample;
    use super::*;

    #[test]
    fn golden() {
        let s = String::from_utf8(render(&sample::run_with_tiers()).unwrap()).unwrap();
        sample::golden("run.json", &s);
    }

    #[test]
    fn round_trips() {
        for run in [sample::run(), sample::run_with_tiers()] {
            let bytes = render(&run).unwrap();
            let back = RunRecord::from_slice(&bytes, "mem").unwrap();
            assert_eq!(back, run);
        }
    }

    #[test]
    fn load_explains_what_is_wrong() {
        let err = |b: &str| {
            RunRecord::from_slice(b.as_bytes(), "f.json")
                .unwrap_err()
                .to_string()
        };
        assert!(err("{").contains("not valid JSON"), "{}", err("{"));
        let nt = r#"{"version":3,"results":[]}"#;
        assert!(
            err(nt).contains(
                "looks like nccl-tests -J output (version 3) but cannot be read: no \"config\""
            ),
            "{}",
            err(nt)
        );
        assert!(err(r#"{"a":1}"#).contains("not a busbw run record"));
        let newer = r#"{"schema":"busbw-run","schema_version":99}"#;
        assert!(err(newer).contains("newer"), "{}", err(newer));
        let broken = r#"{"schema":"busbw-run","schema_version":1}"#;
        assert!(err(broken).contains("malformed"), "{}", err(broken));
    }
}
