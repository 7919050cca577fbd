//! The timed loop's clock and `-z`'s barriers.

use crate::error::Result;
use crate::plan::Plan;
use busbw_collectives::{barrier, Communicator};
use std::time::Instant;

/// `-z`: what follows an operation or an iteration in the timed loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Blocking {
    /// 0 and 2: nothing beyond the operation's own completion.
    Off,
    /// 1: a barrier after each operation, inside the timed loop.
    EachOp,
    /// 3: a barrier after each iteration, outside the time.
    EachIter,
}

impl Blocking {
    fn of(plan: &Plan) -> Blocking {
        match plan.blocking {
            1 => Blocking::EachOp,
            3 => Blocking::EachIter,
            _ => Blocking::Off,
        }
    }
}

/// The timed loop's clock: iteration laps and the loop's total, which with `-z 3` leaves
/// out the barriers between iterations.
pub(super) struct Clock {
    blocking: Blocking,
    agg: usize,
    /// The time source (a fake one in tests).
    now: fn() -> Instant,
    start: Instant,
    lap_start: Instant,
    timed: f64,
    pub(super) laps: Vec<f64>,
}

impl Clock {
    pub(super) fn start(plan: &Plan) -> Clock {
        Clock::with(Blocking::of(plan), plan.agg_iters, plan.iters, Instant::now)
    }

    fn with(blocking: Blocking, agg: u32, iters: u32, now: fn() -> Instant) -> Clock {
        let t = now();
        Clock {
            blocking,
            agg: agg.max(1) as usize,
            now,
            start: t,
            lap_start: t,
            timed: 0.0,
            laps: Vec::with_capacity(iters as usize),
        }
    }

    /// After operation `k` (0-based) of the loop: the barriers `-z` asks for, and a lap at
    /// the end of each iteration.
    pub(super) fn after_op(&mut self, comm: &mut Communicator, k: usize) -> Result<()> {
        self.after_op_with(k, || barrier(comm).map_err(Into::into))
    }

    fn after_op_with(&mut self, k: usize, mut barrier: impl FnMut() -> Result<()>) -> Result<()> {
        if self.blocking == Blocking::EachOp {
            barrier()?;
        }
        if (k + 1).is_multiple_of(self.agg) {
            let now = (self.now)();
            let lap = (now - self.lap_start).as_secs_f64();
            self.laps.push(lap / self.agg as f64);
            self.lap_start = now;
            if self.blocking == Blocking::EachIter {
                self.timed += lap;
                barrier()?;
                self.lap_start = (self.now)();
            }
        }
        Ok(())
    }

    /// Seconds per operation.
    pub(super) fn per_op(&self, total_ops: usize) -> f64 {
        let secs = match self.blocking {
            Blocking::EachIter => self.timed,
            _ => ((self.now)() - self.start).as_secs_f64(),
        };
        secs / total_ops as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::sync::OnceLock;
    use std::time::Duration;

    thread_local! {
        /// The fake clock's reading, as an offset from a fixed instant.
        static FAKE: Cell<Duration> = const { Cell::new(Duration::ZERO) };
    }
    fn fake_now() -> Instant {
        static BASE: OnceLock<Instant> = OnceLock::new();
        *BASE.get_or_init(Instant::now) + FAKE.with(|f| f.get())
    }
    fn advance(d: Duration) {
        FAKE.with(|f| f.set(f.get() + d));
    }

    /// 3 iterations of 2 operations, each operation 10 ms and each barrier 1 s on a fake
    /// clock: returns (seconds per operation, laps, barriers run).
    fn run(blocking: Blocking) -> (f64, Vec<f64>, usize) {
        let (iters, agg) = (3u32, 2u32);
        let mut clock = Clock::with(blocking, agg, iters, fake_now);
        let mut barriers = 0;
        for k in 0..(iters * agg) as usize {
            advance(Duration::from_millis(10));
            clock
                .after_op_with(k, || {
                    barriers += 1;
                    advance(Duration::from_secs(1));
                    Ok(())
                })
                .unwrap();
        }
        (clock.per_op((iters * agg) as usize), clock.laps, barriers)
    }

    #[test]
    fn blocking_modes_put_their_barriers_inside_or_outside_the_time() {
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        // -z 0/2: no barrier; each iteration's lap is its operations' mean.
        let (t, laps, b) = run(Blocking::Off);
        assert_eq!(b, 0);
        assert!(close(t, 0.010), "{t}");
        assert!(
            laps.len() == 3 && laps.iter().all(|&l| close(l, 0.010)),
            "{laps:?}"
        );
        // -z 1: a barrier after every operation, timed.
        let (t, laps, b) = run(Blocking::EachOp);
        assert_eq!(b, 6);
        assert!(close(t, 1.010), "{t}");
        assert!(laps.iter().all(|&l| close(l, 1.010)), "{laps:?}");
        // -z 3: a barrier after every iteration, left out of the time and the laps.
        let (t, laps, b) = run(Blocking::EachIter);
        assert_eq!(b, 3);
        assert!(close(t, 0.010), "{t}");
        assert!(laps.iter().all(|&l| close(l, 0.010)), "{laps:?}");
    }
}
