//! The speed a link rate becomes, and, on a host with an active RDMA port, real transfers and
//! registrations through the NIC (skipped, with a line on stderr, where there is none).

use super::*;
use std::io;

#[test]
fn link_rate_becomes_a_speed() {
    assert_eq!(speed_mbps(Some("400 Gb/sec (4X NDR)")), Some(400_000));
    assert_eq!(speed_mbps(Some("25 Gb/sec (1X EDR)")), Some(25_000));
    assert_eq!(speed_mbps(None), None);
}

/// On a host with an active RDMA port (a RoCE NIC or SoftRoCE: `rdma link add rxe0 type
/// rxe netdev eth0`), two comms in this process move bytes through the NIC.
#[test]
fn loopback_through_the_nic_when_there_is_one() {
    let cfg = VerbsConfig {
        stall_timeout: Duration::from_secs(10),
        ..VerbsConfig::default()
    };
    if let Err(why) = library_devices().and_then(|_| pick_port(&cfg)) {
        // Straight to stderr: the harness captures eprintln!, and a skip must show.
        let _ = writeln!(
            io::stderr(),
            "skipping loopback_through_the_nic_when_there_is_one: no usable RDMA port ({why})"
        );
        return;
    }
    let id = |rank| Identity::new(42, rank);
    let ip: IpAddr = "127.0.0.1".parse().unwrap();
    let a = VerbsTransport::new(id(0), cfg.clone(), ip, None).unwrap();
    let b = VerbsTransport::new(id(1), cfg, ip, None).unwrap();
    let (h, mut l) = a.listen().unwrap();
    let mut s = b.connect(&h, 0, Duration::from_secs(10)).unwrap();
    let mut r = l.accept(Duration::from_secs(10)).unwrap();
    let src: Vec<u8> = (0..1 << 20).map(|i| (i * 7) as u8).collect();
    let mut dst = vec![0u8; 1 << 20];
    let sreg = b
        .register(unsafe {
            MemRegion::new(src.as_ptr() as *mut u8, src.len(), crate::MemoryKind::Host)
        })
        .unwrap();
    let rreg = a
        .register(unsafe { MemRegion::new(dst.as_mut_ptr(), dst.len(), crate::MemoryKind::Host) })
        .unwrap();
    let rid = unsafe { r.irecv(&rreg, dst.as_mut_ptr(), dst.len(), 3) }.unwrap();
    let sid = unsafe { s.isend(&sreg, src.as_ptr(), src.len(), 3) }.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut sd, mut rd) = (None, None);
    while sd.is_none() || rd.is_none() {
        assert!(Instant::now() < deadline, "loopback transfer timed out");
        if sd.is_none() {
            sd = s.test(sid).unwrap();
        }
        if rd.is_none() {
            rd = r.test(rid).unwrap();
        }
    }
    assert_eq!((sd, rd), (Some(src.len()), Some(src.len())));
    assert!(dst == src, "bytes arrived intact");
}

/// On a host with an active RDMA port: the advertised pointer support matches the
/// GPUDirect check, and device memory that is not a live CUDA allocation is never
/// registered: it is refused, or its registration fails, with the error that says to stage.
#[test]
fn device_memory_on_a_nic_is_registered_or_refused_with_a_reason() {
    let cfg = VerbsConfig::default();
    if let Err(why) = library_devices().and_then(|_| pick_port(&cfg)) {
        let _ = writeln!(
            io::stderr(),
            "SKIP device_memory_on_a_nic_is_registered_or_refused_with_a_reason because there is no usable RDMA port ({why})"
        );
        return;
    }
    let ip: IpAddr = "127.0.0.1".parse().unwrap();
    let t = VerbsTransport::new(Identity::new(1, 0), cfg, ip, None).unwrap();
    let p = t.properties().ptr_support;
    let gd = t.gpudirect().clone();
    assert_eq!(
        (p.cuda, p.dmabuf),
        (gd.peermem.is_some(), gd.dmabuf.is_ok())
    );
    // SAFETY: a page-aligned address no allocation holds; the NIC must not accept it.
    let bogus = unsafe {
        MemRegion::new(
            0x7f00_dead_0000 as *mut u8,
            1 << 16,
            crate::MemoryKind::Cuda { device: 0 },
        )
    };
    match t.register(bogus) {
        Err(TransportError::DeviceMemory { missing, .. }) => {
            let _ = writeln!(io::stderr(), "device memory refused: {missing}");
        }
        other => panic!("a bogus device range was not refused: {other:?}"),
    }
}
