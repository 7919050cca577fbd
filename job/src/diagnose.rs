//! Who stopped a job. After a timeout every rank reports whom it waited for, and the ranks
//! waited on that report nothing themselves are the culprits, however long the chain of
//! ranks stuck behind them; a rank that saw a peer's connection close waits briefly for the
//! job's own account, so the message names the root cause, not the messenger.

use crate::{Error, Session};
use busbw_collectives::CommError;
use std::error::Error as StdError;

/// The collective's failure in `e`'s chain, whichever library's error carries it.
pub fn comm_error<'a>(e: &'a (dyn StdError + 'static)) -> Option<&'a CommError> {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(comm) = c.downcast_ref::<CommError>() {
            return Some(comm);
        }
        if let Some(m) = c.downcast_ref::<busbw_measure::Error>() {
            if let Some(comm) = m.comm() {
                return Some(comm);
            }
        }
        if let Some(j) = c.downcast_ref::<Error>() {
            match j.leaf() {
                Error::Comm(comm) => return Some(comm),
                Error::Measure(m) => {
                    if let Some(comm) = m.comm() {
                        return Some(comm);
                    }
                }
                _ => {}
            }
        }
        cause = c.source();
    }
    None
}

/// What a rank reports when it waited for every rank (a collective inside NCCL).
const EVERYONE: &str = "*";

/// How long timed-out ranks wait for each other's reports before naming the silent ones.
pub const DIAGNOSE_WINDOW: std::time::Duration = std::time::Duration::from_millis(1500);

/// "peer rank P is on HOST" for an error about peer P, if the error names one.
pub fn peer_host(session: &Session, e: &(dyn StdError + 'static)) -> Option<String> {
    let peer = comm_error(e).and_then(CommError::peer)?;
    let host = session.host_of(peer)?;
    Some(format!("peer rank {peer} is on {host}"))
}

/// After a timeout, find the ranks that actually stopped. Every rank that timed out reports
/// the peer it waited for; a rank that is waited on but reports nothing itself is dead or hung
/// (a node that vanished, a SIGSTOPped process): that is the culprit, however long the chain of
/// ranks stuck behind it. Without this, each rank would only name its own neighbour.
pub fn diagnose_hang(session: &Session, e: &(dyn StdError + 'static)) -> Option<String> {
    let store = &session.rdv.as_ref()?.store;
    let rank = session.comm.rank();
    // A collective run by a library (NCCL) times out without saying whom it waited for:
    // such a rank waited for everyone ("*").
    let waited = match comm_error(e)? {
        c @ CommError::Timeout { peer: None, .. } => c.peer(),
        c => Some(c.peer()?),
    };
    let text = waited.map_or_else(|| EVERYONE.to_string(), |p| p.to_string());
    store.set(&format!("stuck/{rank}"), text.as_bytes()).ok()?;
    std::thread::sleep(DIAGNOSE_WINDOW);
    let n = session.comm.size();
    let reports: Vec<Option<String>> = (0..n)
        .map(|r| match store.get(&format!("stuck/{r}")) {
            Ok(Some(v)) => Some(String::from_utf8_lossy(&v).into_owned()),
            _ => None,
        })
        .collect();
    let silent: Vec<String> = silent_ranks(&reports)
        .into_iter()
        .map(|(p, by)| {
            let host = session.host_of(p).unwrap_or_else(|| "?".into());
            let by: Vec<String> = by.iter().map(|r| r.to_string()).collect();
            format!("rank {p} on {host} (waited on by rank {})", by.join(", "))
        })
        .collect();
    if silent.is_empty() {
        return None;
    }
    Some(format!(
        "stopped responding: {} (it reported nothing while its peers timed out)",
        silent.join("; ")
    ))
}

/// The ranks that reported nothing although others waited on them, each with who waited;
/// `reports[r]` is rank r's report (the peer it waited for, or [`EVERYONE`]), `None` when
/// it said nothing.
fn silent_ranks(reports: &[Option<String>]) -> Vec<(usize, Vec<usize>)> {
    let n = reports.len();
    let mut waited_on: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (r, rep) in reports.iter().enumerate() {
        match rep.as_deref() {
            Some(EVERYONE) => {
                for (p, w) in waited_on.iter_mut().enumerate() {
                    if p != r {
                        w.push(r);
                    }
                }
            }
            Some(t) => {
                if let Some(p) = t.parse::<usize>().ok().filter(|&p| p < n) {
                    waited_on[p].push(r);
                }
            }
            None => {}
        }
    }
    waited_on
        .into_iter()
        .enumerate()
        .filter(|(p, by)| reports[*p].is_none() && !by.is_empty())
        .collect()
}

/// How long a rank that saw a peer fail waits for the job to name the root cause.
pub const ROOT_CAUSE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether `e` is this rank's echo of the job's abort (it is the account, not a cause).
pub fn is_abort(e: &(dyn StdError + 'static)) -> bool {
    matches!(comm_error(e), Some(CommError::Aborted { .. }))
}

/// A dead peer is usually seen first on the data path ("rank 3 closed the connection")
/// although the root cause is elsewhere (rank 3 only left because rank 2 died). Give the
/// control plane a moment to deliver the job's own account, so the message (and rank 0's
/// report) names the culprit, not the messenger. `None` for an abort (it is the account), for
/// this rank's own failure (`own`: a full disk, a bug, which have no other account to wait
/// for), or in a one-rank job.
pub fn root_cause(session: &Session, e: &(dyn StdError + 'static), own: bool) -> Option<String> {
    if own || is_abort(e) || session.rdv.is_none() {
        return None;
    }
    let until = std::time::Instant::now() + ROOT_CAUSE_WAIT;
    while !session.abort.is_raised() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    session.abort.reason()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reports(v: &[Option<&str>]) -> Vec<Option<String>> {
        v.iter().map(|r| r.map(String::from)).collect()
    }

    #[test]
    fn the_silent_end_of_a_chain_of_waits_is_named() {
        // 0 waits on 1, 1 on 2, 2 is silent: 2 is named, waited on by 1.
        let got = silent_ranks(&reports(&[Some("1"), Some("2"), None, Some("2")]));
        assert_eq!(got, vec![(2, vec![1, 3])]);
        // A silent rank nobody waited on is not named.
        assert!(silent_ranks(&reports(&[Some("1"), Some("0"), None])).is_empty());
    }

    #[test]
    fn a_library_collective_waits_on_everyone_and_names_who_stayed_silent() {
        // NCCL timed out on ranks 0, 1 and 3 (whom they waited for is unknown: "*");
        // rank 2 stopped answering.
        let got = silent_ranks(&reports(&[
            Some(EVERYONE),
            Some(EVERYONE),
            None,
            Some(EVERYONE),
        ]));
        assert_eq!(got, vec![(2, vec![0, 1, 3])]);
        assert!(
            silent_ranks(&reports(&[Some(EVERYONE), Some(EVERYONE)])).is_empty(),
            "everyone reported: nobody to blame"
        );
    }
}
