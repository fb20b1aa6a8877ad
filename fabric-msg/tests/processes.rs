//! Client and server as separate processes: this test binary runs itself
//! as the server (`FABRIC_MSG_TEST_SERVER=<file>`), which writes its
//! bootstrap address to the file, echoes tagged messages and exits.

use crate::common;
use common::*;
use fabric_msg::{connect, Buffer, EventLoop, Listener, LoopConfig, OpKind, RecvOpts, SendOpts, Token};
use std::process::Command;
use std::time::{Duration, Instant};

const ROUNDS: u64 = 20;

/// The server role; a no-op unless the parent process asked for it.
#[test]
#[ignore = "child role: run by client_and_server_in_two_processes through current_exe()"]
fn server_role() {
    let Ok(addr_file) = std::env::var("FABRIC_MSG_TEST_SERVER") else {
        return;
    };
    let p = profile("tcp;ofi_rxm");
    let listener = Listener::bind("127.0.0.1:0").unwrap();
    let tmp = format!("{addr_file}.tmp");
    std::fs::write(&tmp, listener.local_addr().unwrap().to_string()).unwrap();
    std::fs::rename(&tmp, &addr_file).unwrap();
    let mut ev = EventLoop::new(&p, LoopConfig::default()).unwrap();
    let ep = ev.open_endpoint().unwrap();
    let peer = listener.accept(&mut ev, ep).unwrap();
    for i in 0..ROUNDS {
        ev.recv(
            ep,
            Buffer::new(1 << 16),
            RecvOpts {
                tag: Some((i, 0)),
                from: None,
            },
            Token(i),
        )
        .unwrap();
        let d = wait_n(&mut ev, 1).remove(0);
        d.result.unwrap();
        ev.send(
            &peer,
            d.buffer.unwrap(),
            SendOpts {
                tag: Some(i),
                data: Some(i * 3),
            },
            Token(i),
        )
        .unwrap();
        wait_n(&mut ev, 1);
    }
}

#[test]
fn client_and_server_in_two_processes() {
    let addr_file = std::env::temp_dir().join(format!("fabric-msg-server-{}", std::process::id()));
    let _ = std::fs::remove_file(&addr_file);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &test_name(module_path!(), "server_role"),
            "--ignored",
            "--test-threads=1",
        ])
        .env("FABRIC_MSG_TEST_SERVER", &addr_file)
        .spawn()
        .expect("spawn the server process");
    let deadline = Instant::now() + TIMEOUT;
    let addr = loop {
        if let Ok(a) = std::fs::read_to_string(&addr_file) {
            break a.parse::<std::net::SocketAddr>().unwrap();
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("server process exited early: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "the server process never published its address"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    std::fs::remove_file(&addr_file).ok();
    let p = profile("tcp;ofi_rxm");
    let mut ev = EventLoop::new(&p, LoopConfig::default()).unwrap();
    let ep = ev.open_endpoint().unwrap();
    let peer = connect(&mut ev, ep, addr, TIMEOUT).unwrap();
    for i in 0..ROUNDS {
        let len = (i as usize * 3001) % (1 << 16);
        ev.recv(
            ep,
            Buffer::new(1 << 16),
            RecvOpts {
                tag: Some((i, 0)),
                from: None,
            },
            Token(100 + i),
        )
        .unwrap();
        ev.send(
            &peer,
            Buffer::from_slice(&pattern(i, len)),
            SendOpts {
                tag: Some(i),
                data: None,
            },
            Token(i),
        )
        .unwrap();
        let back = wait_n(&mut ev, 2)
            .into_iter()
            .find(|d| d.kind == OpKind::Recv)
            .unwrap();
        assert_eq!(back.data, Some(i * 3));
        assert_eq!(back.buffer.unwrap().as_slice(), pattern(i, len), "round {i}");
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "server process failed: {status}");
}
