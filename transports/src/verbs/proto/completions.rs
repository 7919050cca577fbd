//! How both ends consume completions: draining the queue in batches, and turning a failed
//! completion into the error every later call reports.

use super::{Completion, Op};
use crate::verbs::wc;
use crate::{Result, TransportError};

/// Failure state kept so that every later call reports the first error, not the flushes that
/// follow it.
#[derive(Debug, Default)]
pub(super) struct Sticky(Option<String>);

impl Sticky {
    pub(super) fn check(&self, peer: u32) -> Result<()> {
        match &self.0 {
            Some(msg) => Err(TransportError::Rdma {
                peer,
                msg: msg.clone(),
            }),
            None => Ok(()),
        }
    }
    pub(super) fn fail(&mut self, peer: u32, msg: String) -> TransportError {
        if self.0.is_none() {
            self.0 = Some(msg);
        }
        TransportError::Rdma {
            peer,
            msg: self.0.clone().unwrap_or_default(),
        }
    }
}

pub(super) fn completion_error(
    sticky: &mut Sticky,
    peer: u32,
    c: &Completion,
    first: bool,
    what: &str,
) -> TransportError {
    sticky.fail(
        peer,
        format!(
            "{what} failed: {}",
            wc::explain(c.status, c.vendor_err, first)
        ),
    )
}

/// Feeds every completion `poll` has ready to `each`, 32 at a time; `Ok(true)` when any came.
pub(super) fn drain(
    mut poll: impl FnMut(&mut [Completion]) -> Result<usize>,
    mut each: impl FnMut(Completion) -> Result<()>,
) -> Result<bool> {
    let mut wcs = [NO_COMPLETION; 32];
    let mut any = false;
    loop {
        let n = poll(&mut wcs)?;
        for c in &wcs[..n] {
            each(*c)?;
        }
        any |= n > 0;
        if n < wcs.len() {
            return Ok(any);
        }
    }
}

pub(super) const NO_COMPLETION: Completion = Completion {
    wr_id: 0,
    status: 0,
    vendor_err: 0,
    op: Op::Write,
};
