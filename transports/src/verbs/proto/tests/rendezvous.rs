//! Messages that wait for their ready-to-receive entry: ordering, credits, and how failures
//! and disagreements are worded.

use super::*;

#[test]
fn messages_arrive_in_order_over_several_qps() {
    let (mut s, mut r, mut tx, mut rx, link) = setup(4, 2);
    let now = Instant::now();
    let src: Vec<Vec<u8>> = (0..6u8).map(|i| vec![i + 1; 100 + i as usize]).collect();
    let mut dst: Vec<Vec<u8>> = (0..6).map(|_| vec![0u8; 200]).collect();
    for round in 0..2 {
        let mut rids = vec![];
        let mut sids = vec![];
        for k in 0..3 {
            let m = round * 3 + k;
            let d = &mut dst[m];
            rids.push(
                r.post(d.as_mut_ptr() as u64, d.len() as u32, 9, 7, true, now)
                    .unwrap(),
            );
            sids.push(s.post(local(&src[m]), 7, now).unwrap());
        }
        for _ in 0..4 {
            r.progress(&mut rx, now).unwrap();
            s.progress(&mut tx, now).unwrap();
        }
        r.progress(&mut rx, now).unwrap();
        for (k, (rid, sid)) in rids.into_iter().zip(sids).enumerate() {
            let m = round * 3 + k;
            assert_eq!(r.take(rid).unwrap(), Some(src[m].len()), "message {m} size");
            assert_eq!(s.take(sid).unwrap(), Some(src[m].len()));
            assert_eq!(&dst[m][..src[m].len()], &src[m][..], "message {m} bytes");
            assert!(r.take(rid).is_err(), "reported once");
        }
    }
    let qps: Vec<usize> = link.borrow().writes.iter().map(|w| w.0).collect();
    assert_eq!(qps, [0, 1, 0, 1, 0, 1], "round-robin over the queue pairs");
    assert_eq!(r.credits_in_use(), 0);
}

#[test]
fn sender_waits_for_the_receiver_and_credits_limit_announcements() {
    let (mut s, mut r, mut tx, mut rx, link) = setup(2, 1);
    let now = Instant::now();
    let src = [[1u8; 8], [2; 8]];
    let mut dst = [[0u8; 8]; 2];
    let sids: Vec<_> = src
        .iter()
        .map(|b| s.post(local(b), 0, now))
        .collect::<Result<_>>()
        .unwrap();
    s.progress(&mut tx, now).unwrap();
    assert!(
        link.borrow().writes.is_empty(),
        "nothing is written before the receiver says where"
    );
    assert!(
        matches!(
            s.post(local(&src[0]), 0, now),
            Err(TransportError::TooManyRequests { peer: 3, max: 2 })
        ),
        "a third message would reuse message 0's slot"
    );
    let rids: Vec<_> = dst
        .iter_mut()
        .map(|d| r.post(d.as_mut_ptr() as u64, 8, 1, 0, true, now))
        .collect::<Result<_>>()
        .unwrap();
    r.progress(&mut rx, now).unwrap();
    assert_eq!((link.borrow().cts_posts, r.credits_in_use()), (2, 2));
    s.progress(&mut tx, now).unwrap();
    assert_eq!(link.borrow().writes.len(), 2);
    r.progress(&mut rx, now).unwrap();
    assert_eq!(r.credits_in_use(), 0, "both arrived");
    for id in rids {
        assert_eq!(r.take(id).unwrap(), Some(8));
    }
    s.progress(&mut tx, now).unwrap();
    for id in sids {
        assert_eq!(s.take(id).unwrap(), Some(8));
    }
    assert_eq!(dst, src);
}

#[test]
fn receives_beyond_the_fifo_wait_for_a_credit() {
    let (mut s, mut r, mut tx, mut rx, link) = setup(2, 1);
    let now = Instant::now();
    let src = [[1u8; 4], [2; 4]];
    let mut dst = [[0u8; 4]; 2];
    let a = r
        .post(dst[0].as_mut_ptr() as u64, 4, 1, 0, true, now)
        .unwrap();
    let b = r
        .post(dst[1].as_mut_ptr() as u64, 4, 1, 0, true, now)
        .unwrap();
    assert!(matches!(
        r.post(0, 4, 1, 0, true, now),
        Err(TransportError::TooManyRequests { peer: 5, max: 2 })
    ));
    // Take the FIFO entries' completions away: the receiver must not reuse their slots.
    link.borrow_mut().hold = true;
    r.progress(&mut rx, now).unwrap();
    assert_eq!(link.borrow().cts_posts, 2);
    link.borrow_mut().hold = false;
    let sa = s.post(local(&src[0]), 0, now).unwrap();
    s.progress(&mut tx, now).unwrap();
    r.progress(&mut rx, now).unwrap();
    assert_eq!(r.take(a).unwrap(), Some(4));
    // Message 2 reuses slot 0 now that message 0 arrived and its entry was acknowledged.
    let c = r
        .post(dst[0].as_mut_ptr() as u64, 4, 1, 0, true, now)
        .unwrap();
    r.progress(&mut rx, now).unwrap();
    assert_eq!(link.borrow().cts_posts, 3);
    assert_eq!(r.credits_in_use(), 2);
    s.progress(&mut tx, now).unwrap();
    assert_eq!(s.take(sa).unwrap(), Some(4));
    let sb = s.post(local(&src[1]), 0, now).unwrap();
    let sc = s.post(local(&src[0]), 0, now).unwrap();
    s.progress(&mut tx, now).unwrap();
    r.progress(&mut rx, now).unwrap();
    s.progress(&mut tx, now).unwrap();
    assert_eq!((r.take(b).unwrap(), r.take(c).unwrap()), (Some(4), Some(4)));
    assert_eq!(
        (s.take(sb).unwrap(), s.take(sc).unwrap()),
        (Some(4), Some(4))
    );
    assert_eq!(dst, [[1; 4], [2; 4]]);
}

#[test]
fn retry_exceeded_on_the_first_write_blames_reachability_and_sticks() {
    let (mut s, mut r, mut tx, mut rx, link) = setup(4, 1);
    let now = Instant::now();
    let src = [7u8; 16];
    let mut dst = [0u8; 16];
    r.post(dst.as_mut_ptr() as u64, 16, 1, 0, true, now)
        .unwrap();
    r.progress(&mut rx, now).unwrap();
    s.post(local(&src), 0, now).unwrap();
    link.borrow_mut().fail_next_write = Some(wc::RETRY_EXC_ERR);
    s.progress(&mut tx, now).unwrap();
    let e = s.progress(&mut tx, now).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("peer unreachable or wrong GID") && msg.contains("rank 3"),
        "{msg}"
    );
    let again = s.progress(&mut tx, now).unwrap_err().to_string();
    assert_eq!(
        again, msg,
        "later calls report the first error, not flushes"
    );
    assert!(s.post(local(&src), 0, now).is_err());
}

#[test]
fn errors_after_traffic_flowed_do_not_blame_the_gid() {
    let (mut s, mut r, mut tx, mut rx, link) = setup(4, 1);
    let now = Instant::now();
    let src = [7u8; 16];
    let mut dst = [0u8; 16];
    for _ in 0..2 {
        r.post(dst.as_mut_ptr() as u64, 16, 1, 0, true, now)
            .unwrap();
    }
    r.progress(&mut rx, now).unwrap();
    let a = s.post(local(&src), 0, now).unwrap();
    s.progress(&mut tx, now).unwrap();
    s.progress(&mut tx, now).unwrap();
    assert_eq!(s.take(a).unwrap(), Some(16));
    s.post(local(&src), 0, now).unwrap();
    link.borrow_mut().fail_next_write = Some(wc::RETRY_EXC_ERR);
    s.progress(&mut tx, now).unwrap();
    let msg = s.progress(&mut tx, now).unwrap_err().to_string();
    assert!(
        msg.contains("stopped acknowledging") && !msg.contains("wrong GID"),
        "{msg}"
    );
    // A failed receive-side completion is decoded too.
    link.borrow_mut().recv_cq.push_back(Completion {
        wr_id: 0,
        status: 10,
        vendor_err: 0,
        op: Op::Write,
    });
    let msg = r.progress(&mut rx, now).unwrap_err().to_string();
    assert!(
        msg.contains("IBV_WC_REM_ACCESS_ERR") && msg.contains("rank 5"),
        "{msg}"
    );
}

#[test]
fn silence_times_out_naming_the_message() {
    let (mut s, mut r, mut tx, mut rx, link) = setup(4, 1);
    let t0 = Instant::now();
    let later = t0 + Duration::from_secs(11);
    let src = [7u8; 16];
    let mut dst = [0u8; 16];
    s.post(local(&src), 0, t0).unwrap();
    s.progress(&mut tx, t0 + Duration::from_secs(9)).unwrap();
    let e = s.progress(&mut tx, later).unwrap_err().to_string();
    assert!(
        e.contains("message 0") && e.contains("ready-to-receive"),
        "{e}"
    );

    r.post(dst.as_mut_ptr() as u64, 16, 1, 0, true, t0).unwrap();
    r.progress(&mut rx, t0).unwrap();
    link.borrow_mut().hold = true;
    r.progress(&mut rx, t0 + Duration::from_secs(5)).unwrap();
    let e = r.progress(&mut rx, later).unwrap_err().to_string();
    assert!(e.contains("never arrived") && e.contains("rank 5"), "{e}");
}

#[test]
fn size_and_tag_disagreements_are_named() {
    let (mut s, mut r, mut tx, mut rx, _) = setup(4, 1);
    let now = Instant::now();
    let big = [1u8; 32];
    let mut dst = [0u8; 16];
    r.post(dst.as_mut_ptr() as u64, 16, 1, 4, true, now)
        .unwrap();
    r.progress(&mut rx, now).unwrap();
    s.post(local(&big), 4, now).unwrap();
    assert!(matches!(
        s.progress(&mut tx, now),
        Err(TransportError::Truncated {
            peer: 3,
            sent: 32,
            posted: 16
        })
    ));

    let (mut s, mut r, mut tx, mut rx, _) = setup(4, 1);
    r.post(dst.as_mut_ptr() as u64, 16, 1, 4, true, now)
        .unwrap();
    r.progress(&mut rx, now).unwrap();
    s.post(local(&big[..8]), 5, now).unwrap();
    assert!(matches!(
        s.progress(&mut tx, now),
        Err(TransportError::TagMismatch {
            peer: 3,
            expected: 4,
            got: 5
        })
    ));
}
