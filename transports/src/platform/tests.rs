use super::*;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

#[test]
fn names_parse_and_misspellings_say_what_is_allowed() {
    assert_eq!("portable".parse::<Platform>(), Ok(Platform::Portable));
    assert_eq!(" Portable ".parse::<Platform>(), Ok(Platform::Portable));
    #[cfg(target_os = "linux")]
    assert_eq!("linux".parse::<Platform>(), Ok(Platform::Linux));
    #[cfg(not(target_os = "linux"))]
    assert!(matches!(
        "linux".parse::<Platform>(),
        Err(PlatformError::Unavailable(_))
    ));
    let e = "portabel".parse::<Platform>().unwrap_err();
    assert_eq!(e, PlatformError::Unknown("portabel".into()));
    let text = e.to_string();
    assert!(
        text.contains(PLATFORM_ENV) && text.contains("portable") && text.contains("portabel"),
        "{text}"
    );
    assert_eq!(Platform::native(), Platform::ALL[0]);
    for p in Platform::ALL {
        assert_eq!(p.name().parse::<Platform>(), Ok(*p));
    }
}

/// A segment passed by descriptor: both mappings see the same bytes, the receiver's check
/// accepts it, and a wrong size is refused.
#[test]
fn anonymous_memory_is_shared_through_its_descriptor() {
    for &p in Platform::ALL {
        let len = 3 * 4096;
        let fd = p.anonymous_memory("busbw-test", len).unwrap();
        p.check_received(fd.as_fd(), len).unwrap();
        assert!(p.check_received(fd.as_fd(), len + 4096).is_err(), "{p}");
        let a = p.map(fd.as_fd(), len).unwrap();
        let b = p.map(fd.as_fd(), len).unwrap();
        // SAFETY: both map len bytes of the same file.
        unsafe {
            a.as_ptr().add(5000).write_volatile(0x5a);
            assert_eq!(b.as_ptr().add(5000).read_volatile(), 0x5a, "{p}");
            unmap(a, len);
            unmap(b, len);
        }
    }
}

#[cfg(target_os = "linux")]
#[test]
fn linux_segments_are_sealed_and_portable_ones_are_not_sealed_memfds() {
    let fd = Platform::Linux
        .anonymous_memory("busbw-test", 4096)
        .unwrap();
    // SAFETY: fcntl on a descriptor we own.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    assert!(seals & libc::F_SEAL_SHRINK != 0);
    // A portable segment is no memfd: the Linux check, which wants seals, refuses it.
    let fd = Platform::Portable
        .anonymous_memory("busbw-test", 4096)
        .unwrap();
    assert!(Platform::Linux.check_received(fd.as_fd(), 4096).is_err());
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
    let link = link.to_string_lossy();
    assert!(
        link.starts_with("/dev/shm/busbw-test.") && link.ends_with(" (deleted)"),
        "{link}"
    );
}

/// A peer maps a shareable region from its key alone; a key whose identity does not match
/// is refused; the portable object's name is gone once its owner drops it.
#[test]
fn shareable_memory_is_mapped_from_its_key() {
    for &p in Platform::ALL {
        let s = p.shareable(2 * 4096 + 100).unwrap();
        let key = s.key();
        assert_eq!(key.is_named(), p == Platform::Portable, "{p}");
        assert_eq!(PeerKey::from_words(key.to_words()), key);
        let m = map_peer(&key).unwrap();
        assert_eq!(m.len(), 2 * 4096 + 100);
        // SAFETY: both map the same bytes.
        unsafe {
            s.as_ptr().as_ptr().add(8200).write_volatile(0xa5);
            assert_eq!(m.at(8200).read_volatile(), 0xa5, "{p}");
        }
        let wrong = PeerKey {
            ino: key.ino ^ 1,
            ..key
        };
        let e = map_peer(&wrong).err().expect("a wrong inode").to_string();
        assert!(e.contains("not the buffer it described"), "{p}: {e}");
        drop(m);
        drop(s);
        if p == Platform::Portable {
            assert!(map_peer(&key).is_err(), "the name outlived its owner");
        }
    }
}

#[test]
fn cross_memory_reads_exist_only_on_linux() {
    assert!(Platform::Portable.cross_memory().is_none());
    #[cfg(target_os = "linux")]
    {
        static WORD: u64 = 0x1234_5678_9abc_def0;
        let cma = Platform::Linux.cross_memory().expect("linux reads peers");
        let pid = std::process::id() as i32;
        assert_eq!(cma.read_u64(pid, &WORD as *const u64 as u64), Some(WORD));
    }
}

#[test]
fn node_and_process_facts() {
    #[cfg(target_os = "linux")]
    {
        let boot = Platform::Linux.boot_id().expect("linux has a boot id");
        assert_eq!(boot.len(), 36, "{boot}");
        assert!(Platform::Linux.kernel_hostname().is_some());
    }
    for &p in Platform::ALL {
        let rss = p.resident_bytes().unwrap_or(0);
        assert!(rss > 1 << 20, "{p}: {rss}");
        let mut a = [0u8; 300];
        let mut b = [0u8; 300];
        p.fill_random(&mut a).unwrap();
        p.fill_random(&mut b).unwrap();
        assert_ne!(a, b, "{p}");
    }
}

/// A local listener takes a connection at the address it advertises; the portable socket
/// file goes with the listener.
#[test]
fn local_listeners_take_connections() {
    for &p in Platform::ALL {
        let name = format!("busbw-test.{}.{}", std::process::id(), p.name());
        let l = p.local_listener(&name).unwrap();
        let abstract_name = l.addr().starts_with('@');
        assert_eq!(
            abstract_name,
            cfg!(target_os = "linux") && p != Platform::Portable
        );
        let fd = connect_local(l.addr())
            .unwrap()
            .expect("a listener is there");
        let mut client = UnixStream::from(fd);
        client.set_nonblocking(false).unwrap();
        let (mut server, _) = loop {
            match l.listener().accept() {
                Ok(s) => break s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        };
        server.set_nonblocking(false).unwrap();
        client.write_all(b"hi").unwrap();
        let mut got = [0u8; 2];
        server.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hi");
        let addr = l.addr().to_string();
        drop(l);
        if !abstract_name {
            assert!(!std::path::Path::new(&addr).exists(), "{addr} left behind");
        }
        assert!(
            connect_local(&addr).unwrap().is_none(),
            "{p}: still listening"
        );
    }
}
