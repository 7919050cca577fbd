//! `NCCL_TESTS_SPLIT`: a job run as groups at once, each on its own communicator, as
//! operators bisect a cluster with nccl-tests (`MOD2` pairs even and odd nodes).

use crate::error::{Context, Result};
use crate::{JoinOptions, Session};
use busbw_collectives::Communicator;
use busbw_launchers::World;
use busbw_measure::plan::{Engine, Split};
use busbw_measure::Plan;

/// `NCCL_TESTS_SPLIT`: the groups of a job of `n` ranks, as (color, members) in order of
/// color; each rank's process is its rank divided by the ranks per process, as nccl-tests
/// colors MPI processes.
pub fn split_groups(split: Split, n: usize, per_process: usize) -> Vec<(usize, Vec<usize>)> {
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    for r in 0..n {
        let c = split.color(r / per_process.max(1));
        match groups.iter_mut().find(|(color, _)| *color == c) {
            Some((_, members)) => members.push(r),
            None => groups.push((c, vec![r])),
        }
    }
    groups.sort_by_key(|(c, _)| *c);
    groups
}

/// This rank's split group: its index among the groups, its color and its members.
pub struct SplitGroup {
    pub index: usize,
    pub groups: Vec<(usize, Vec<usize>)>,
}

impl SplitGroup {
    pub fn color(&self) -> usize {
        self.groups[self.index].0
    }

    pub fn members(&self) -> &[usize] {
        &self.groups[self.index].1
    }

    /// This rank's communicator in its group: transports chosen as the job's were
    /// (`--transport`, the same RDMA port), connections of its own; with device buffers on
    /// busbw's own engine, split by host and rail when the group spans hosts
    /// ([`crate::hosts::split`]).
    pub fn communicator(
        &self,
        session: &Session,
        world: &World,
        opts: &JoinOptions,
        plan: &Plan,
    ) -> Result<Communicator> {
        let factory = crate::transport::session_factory(session, world, opts, plan)?;
        let nodes: Vec<usize> = self
            .members()
            .iter()
            .map(|&r| session.comm.nodes().get(r).copied().unwrap_or(r))
            .collect();
        let name = format!("split/{}", self.color());
        let mut comm = factory
            .build(&name, self.members(), &nodes)
            .with_context(|| {
                format!("building the communicator of split group {}", self.color())
            })?;
        if plan.gpus > 0 && plan.engine == Engine::Own {
            crate::hosts::split(&mut comm, &factory, &name, self.members()).with_context(|| {
                format!("splitting split group {} by host and rail", self.color())
            })?;
        }
        Ok(comm)
    }
}

/// `0-3,8,10-11`: the launchers' folded ranks, without their spaces.
pub fn rank_list(ranks: &[usize]) -> String {
    busbw_launchers::rendezvous::fold_ranges(ranks).replace(", ", ",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_groups_color_processes_not_ranks() {
        // 4 processes × 2 ranks (-t 2), MOD2: processes 0 and 2 together.
        let g = split_groups(Split::Mod(2), 8, 2);
        assert_eq!(g, [(0, vec![0, 1, 4, 5]), (1, vec![2, 3, 6, 7])]);
        // Colors need not be dense; groups come in color order.
        let g = split_groups(Split::Or(4), 6, 1);
        assert_eq!(
            g,
            [(4, vec![0, 4]), (5, vec![1, 5]), (6, vec![2]), (7, vec![3])]
        );
        assert_eq!(rank_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(rank_list(&[5]), "5");
    }
}
