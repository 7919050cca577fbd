//! AlltoAllv's per-peer sizes, which no [`Case`](crate::reference::Case) describes.

use busbw_collectives::testing::{run_threads, thread_world, ThreadTransport};
use busbw_collectives::Data;

/// AlltoAllv with irregular sizes, zeros included, out of place and in place, over the
/// in-process and shared-memory transports: every block lands at its sender's offset.
#[test]
fn alltoallv_moves_every_irregular_block() {
    use busbw_collectives::alltoallv;
    let n = 4;
    // Bytes rank i sends to rank j.
    let m = |i: usize, j: usize| ((i * 3 + j * 5) % 7) * 24;
    let byte = |i: usize, j: usize, k: usize| (i * 64 + j * 16 + k % 13) as u8;
    for kind in [ThreadTransport::Inproc, ThreadTransport::Shm] {
        for in_place in [false, true] {
            let comms = thread_world(n, kind, Default::default()).unwrap();
            let got = run_threads(comms, |comm| {
                let r = comm.rank();
                let sends: Vec<usize> = (0..n).map(|j| m(r, j)).collect();
                let recvs: Vec<usize> = (0..n).map(|j| m(j, r)).collect();
                let mut send = Vec::new();
                for (j, &s) in sends.iter().enumerate() {
                    send.extend((0..s).map(|k| byte(r, j, k)));
                }
                let rtotal: usize = recvs.iter().sum();
                let mut recv = vec![0xeeu8; rtotal.max(send.len())];
                let res = if in_place {
                    recv[..send.len()].copy_from_slice(&send);
                    alltoallv(comm, Data::in_place(&mut recv), &sends, &recvs)
                } else {
                    let d = Data::out_of_place(&send, &mut recv);
                    alltoallv(comm, d, &sends, &recvs)
                };
                res.map(|()| (r, recvs, recv))
            });
            for g in got {
                let (r, recvs, recv) = g.unwrap();
                let mut at = 0;
                for (j, &len) in recvs.iter().enumerate() {
                    let want: Vec<u8> = (0..len).map(|k| byte(j, r, k)).collect();
                    assert_eq!(
                        recv[at..at + len],
                        want[..],
                        "rank {r} from {j}, in place {in_place}"
                    );
                    at += len;
                }
            }
        }
    }
}
