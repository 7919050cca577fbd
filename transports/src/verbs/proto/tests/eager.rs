//! Small messages on the eager path: either arrival order, the window the ring and credits
//! allow, mixing with announced messages, and failures.

use super::*;

fn eager_imm(link: &Rc<RefCell<Link>>) -> Vec<bool> {
    link.borrow()
        .writes
        .iter()
        .map(|w| w.1 & IMM_EAGER != 0)
        .collect()
}

#[test]
fn small_messages_leave_at_once_and_land_whichever_side_comes_first() {
    let (mut s, mut r, mut tx, mut rx, link) = setup_eager(4, 2, 64);
    let now = Instant::now();
    r.prime(&mut rx).unwrap();
    let src: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i + 10; 8 + i as usize]).collect();
    let sids: Vec<_> = src
        .iter()
        .map(|b| s.post(local(b), 3, now).unwrap())
        .collect();
    s.progress(&mut tx, now).unwrap();
    assert_eq!(eager_imm(&link), [true; 3], "no receive was posted yet");
    s.progress(&mut tx, now).unwrap();
    for (id, b) in sids.into_iter().zip(&src) {
        assert_eq!(s.take(id).unwrap(), Some(b.len()), "done once acknowledged");
    }
    let mut dst = [[0u8; 64]; 3];
    // The first receive is posted before the receiver sees anything, the others after.
    let a = r
        .post(dst[0].as_mut_ptr() as u64, 64, 1, 3, true, now)
        .unwrap();
    r.progress(&mut rx, now).unwrap();
    let rest: Vec<_> = dst[1..]
        .iter_mut()
        .map(|d| r.post(d.as_mut_ptr() as u64, 64, 1, 3, true, now).unwrap())
        .collect();
    r.progress(&mut rx, now).unwrap();
    assert_eq!(r.take(a).unwrap(), Some(8));
    for (k, id) in rest.into_iter().enumerate() {
        assert_eq!(r.take(id).unwrap(), Some(src[k + 1].len()));
    }
    for (d, b) in dst.iter().zip(&src) {
        assert_eq!(&d[..b.len()], &b[..]);
    }
    let l = link.borrow();
    assert_eq!(l.cts_posts, 0, "small receives announce nothing");
    assert_eq!(
        l.writes.iter().map(|w| w.0).collect::<Vec<_>>(),
        [0, 1, 0],
        "round-robin over the queue pairs"
    );
}

#[test]
fn the_eager_window_closes_at_the_ring_and_credits_reopen_it() {
    let (mut s, mut r, mut tx, mut rx, link) = setup_eager(4, 1, 16);
    let now = Instant::now();
    r.prime(&mut rx).unwrap();
    let src = [5u8; 16];
    let mut sent = 0;
    // Eight messages; the receiver takes none yet.
    for _ in 0..8 {
        let id = s.post(local(&src), 0, now).unwrap();
        s.progress(&mut tx, now).unwrap();
        s.progress(&mut tx, now).unwrap();
        if s.take(id).unwrap().is_some() {
            sent += 1;
        } else {
            // Not written: the receiver's ring is full. It must stay queued.
            assert_eq!(link.borrow().writes.len(), 4);
            break;
        }
    }
    assert_eq!(sent, 4, "a ring of four slots takes four messages");
    let mut dst = [[0u8; 16]; 4];
    let mut rids: Vec<_> = dst
        .iter_mut()
        .take(2)
        .map(|d| r.post(d.as_mut_ptr() as u64, 16, 1, 0, true, now).unwrap())
        .collect();
    r.progress(&mut rx, now).unwrap();
    assert_eq!(
        link.borrow().credit,
        2,
        "two released: half the ring, worth telling"
    );
    s.progress(&mut tx, now).unwrap();
    assert_eq!(
        link.borrow().writes.len(),
        5,
        "message 4 went; the next waits for its slot"
    );
    for id in rids.drain(..) {
        assert_eq!(r.take(id).unwrap(), Some(16));
    }
    // Messages 2-4 (message 4 went on the credit).
    for d in dst.iter_mut().skip(1) {
        rids.push(r.post(d.as_mut_ptr() as u64, 16, 1, 0, true, now).unwrap());
    }
    r.progress(&mut rx, now).unwrap();
    for id in rids {
        assert_eq!(r.take(id).unwrap(), Some(16));
    }
    assert_eq!(link.borrow().credit, 5);
    assert_eq!(link.borrow().credit_posts, 2);
    assert_eq!(dst, [[5u8; 16]; 4]);
}

#[test]
fn eager_and_announced_messages_mix_in_order() {
    let (mut s, mut r, mut tx, mut rx, link) = setup_eager(8, 1, 16);
    let now = Instant::now();
    r.prime(&mut rx).unwrap();
    let src = [vec![1u8; 8], vec![2u8; 100], vec![3u8; 8], vec![4u8; 16]];
    // A large receive for a small message: it still comes eagerly.
    let caps = [8usize, 100, 100, 16];
    let mut dst: Vec<Vec<u8>> = caps.iter().map(|&c| vec![0u8; c]).collect();
    let sids: Vec<_> = src
        .iter()
        .map(|b| s.post(local(b), 0, now).unwrap())
        .collect();
    s.progress(&mut tx, now).unwrap();
    assert_eq!(
        eager_imm(&link),
        [true],
        "message 1 waits for its entry and holds back message 2"
    );
    let rids: Vec<_> = dst
        .iter_mut()
        .map(|d| {
            r.post(d.as_mut_ptr() as u64, d.len() as u32, 1, 0, true, now)
                .unwrap()
        })
        .collect();
    for _ in 0..3 {
        r.progress(&mut rx, now).unwrap();
        s.progress(&mut tx, now).unwrap();
    }
    r.progress(&mut rx, now).unwrap();
    assert_eq!(eager_imm(&link), [true, false, true, true]);
    assert_eq!(link.borrow().cts_posts, 2, "the two large receives");
    s.progress(&mut tx, now).unwrap();
    for (k, (rid, sid)) in rids.into_iter().zip(sids).enumerate() {
        assert_eq!(r.take(rid).unwrap(), Some(src[k].len()), "message {k}");
        assert_eq!(s.take(sid).unwrap(), Some(src[k].len()));
        assert_eq!(&dst[k][..src[k].len()], &src[k][..]);
    }
    assert_eq!(r.credits_in_use(), 0);
}

#[test]
fn eager_disagreements_are_named_by_the_receiver() {
    let now = Instant::now();
    let src = [1u8; 12];
    let dst = [0u8; 12];
    let case = |cap: u32, tag: u32, host: bool| {
        let (mut s, mut r, mut tx, mut rx, _) = setup_eager(4, 1, 16);
        r.prime(&mut rx).unwrap();
        s.post(local(&src), 4, now).unwrap();
        s.progress(&mut tx, now).unwrap();
        let d = dst.as_ptr() as u64;
        r.post(d, cap, 1, tag, host, now).unwrap();
        r.progress(&mut rx, now).unwrap_err()
    };
    assert!(matches!(
        case(8, 4, true),
        TransportError::Truncated {
            peer: 5,
            sent: 12,
            posted: 8
        }
    ));
    assert!(matches!(
        case(12, 9, true),
        TransportError::TagMismatch {
            peer: 5,
            expected: 9,
            got: 4
        }
    ));
    let e = case(12, 4, false).to_string();
    assert!(
        e.contains("device memory") && e.contains("BUSBW_IB_EAGER=0"),
        "{e}"
    );
    assert_eq!(dst, [0u8; 12], "nothing was copied");
}

#[test]
fn a_failed_eager_write_fails_its_send() {
    let (mut s, mut r, mut tx, mut rx, link) = setup_eager(4, 1, 16);
    let now = Instant::now();
    r.prime(&mut rx).unwrap();
    let src = [7u8; 8];
    link.borrow_mut().fail_next_write = Some(wc::RETRY_EXC_ERR);
    let a = s.post(local(&src), 0, now).unwrap();
    s.progress(&mut tx, now).unwrap();
    assert_eq!(
        s.take(a).unwrap(),
        None,
        "not done before its acknowledgement"
    );
    let e = s.progress(&mut tx, now).unwrap_err().to_string();
    assert!(e.contains("peer unreachable or wrong GID"), "{e}");
    assert!(s.post(local(&src), 0, now).is_err());
}
