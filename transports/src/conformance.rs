//! Behaviour every transport owes its users, as checks any transport can be put through: the
//! host tests run them on tcp and shm, the SoftRoCE guest tests on verbs, so a transport
//! cannot quietly skip one.

use crate::{Identity, MemRegion, MemoryKind, Registration, Transport};
use std::time::{Duration, Instant};

/// A listener of job id `job` proving token "right" accepts only a connector of the same job
/// id with the same token: connectors with another token or of another job id, which connect
/// first, are refused, and the honest one that connects after them is the first connection
/// accepted and carries a message. Connections are accepted in the order they were made, so
/// this needs no timing. `make` builds the transport under test for an identity. `Err` says
/// which check failed.
pub fn refuses_strangers(
    job: u64,
    make: &dyn Fn(Identity) -> Result<Box<dyn Transport>, String>,
) -> Result<(), String> {
    let right = |job, rank| Identity::new(job, rank).with_token(Some("right"));
    let listening = make(right(job, 0))?;
    let (handle, mut listener) = listening.listen().map_err(|e| format!("listen: {e}"))?;
    let strangers = [
        (
            "a connector of the same job id with another token",
            Identity::new(job, 1).with_token(Some("wrong")),
        ),
        ("a connector of another job id", right(job ^ 1, 1)),
    ];
    let t = Duration::from_secs(20);
    let mut held = Vec::new();
    for (channel, (_, id)) in strangers.iter().enumerate() {
        let s = make(*id)?;
        // The connect itself succeeds (it does not wait for the acceptor): the refusal is the
        // listener's.
        let c = s.connect(&handle, channel as u32, t);
        held.push((s, c));
    }
    let honest = make(right(job, 1))?;
    let mut send = honest
        .connect(&handle, 3, t)
        .map_err(|e| format!("the honest connector: {e}"))?;
    let mut recv = listener
        .accept(t)
        .map_err(|e| format!("the honest connector was not accepted: {e}"))?;
    if let Some((who, _)) = strangers.get(recv.channel() as usize) {
        return Err(format!("{who} was accepted (as rank {})", recv.peer()));
    }
    if (recv.peer(), recv.channel()) != (1, 3) {
        return Err(format!(
            "the honest connector arrived as rank {} on channel {}, not rank 1 on channel 3",
            recv.peer(),
            recv.channel()
        ));
    }
    let mut out: Vec<u8> = (0..64u8).collect();
    let mut into = vec![0u8; 64];
    let reg = |t: &dyn Transport, b: &mut [u8]| -> Result<Registration, String> {
        // SAFETY: the buffers outlive both registrations and every request below, which
        // complete (or fail) before this function returns.
        let region = unsafe { MemRegion::new(b.as_mut_ptr(), b.len(), MemoryKind::Host) };
        t.register(region).map_err(|e| format!("register: {e}"))
    };
    let (rs, rr) = (reg(&*honest, &mut out)?, reg(&*listening, &mut into)?);
    // SAFETY: both buffers are registered above and stay untouched until the requests finish.
    let (s, r) = unsafe {
        (
            send.isend(&rs, out.as_ptr(), 64, 9),
            recv.irecv(&rr, into.as_mut_ptr(), 64, 9),
        )
    };
    let (s, r) = (s.map_err(|e| e.to_string())?, r.map_err(|e| e.to_string())?);
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut sent, mut got) = (None, None);
    while sent.is_none() || got.is_none() {
        if Instant::now() > deadline {
            return Err("the honest connection carried no message in 20 s".into());
        }
        if sent.is_none() {
            sent = send.test(s).map_err(|e| format!("send: {e}"))?;
        }
        if got.is_none() {
            got = recv.test(r).map_err(|e| format!("receive: {e}"))?;
        }
        std::thread::yield_now();
    }
    let _ = (honest.deregister(rs), listening.deregister(rr));
    if got != Some(64) || into != out {
        return Err(format!(
            "the honest message arrived as {got:?} bytes {into:?}"
        ));
    }
    Ok(())
}
