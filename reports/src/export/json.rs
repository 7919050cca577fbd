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

    /// The stable twin of `fuzz/fuzz_targets/run_record.rs`: a busbw record and an nccl-tests
    /// `-J` file, mutated (bytes changed, cut short, numbers made huge or negative), through
    /// what `busbw compare` does with a file. It must return an error or a record, never
    /// panic.
    #[test]
    fn mutated_reports_load_or_fail_cleanly() {
        let run = sample::run();
        let corpus = [
            render(&run).unwrap(),
            crate::export::nccl_json::render(&run).into_bytes(),
        ];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let swaps: [&[u8]; 6] = [
            b"-1",
            b"1e308",
            b"null",
            b"[]",
            b"\"\"",
            b"18446744073709551616",
        ];
        for i in 0..3_000usize {
            let mut d = corpus[i % 2].clone();
            match i % 3 {
                0 => d.truncate((next() as usize) % (d.len() + 1)),
                1 => {
                    for _ in 0..1 + next() % 4 {
                        let at = (next() as usize) % d.len();
                        let junk = b" {}[],:\"0-9eE.a";
                        d[at] = junk[(next() as usize) % junk.len()];
                    }
                }
                _ => {
                    // Replace one number with something no writer produces.
                    let digits: Vec<usize> =
                        (0..d.len()).filter(|&j| d[j].is_ascii_digit()).collect();
                    let at = digits[(next() as usize) % digits.len()];
                    let with = swaps[(next() as usize) % swaps.len()];
                    d.splice(at..at + 1, with.iter().copied());
                }
            }
            crate::run::fuzz_load(&d);
        }
    }
}
