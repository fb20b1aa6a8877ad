//! Endpoint names from a hostile or broken peer never reach libfabric
//! unchecked. Before they were checked, an empty name in a client's
//! handshake crashed a tcp;ofi_rxm server inside `fi_av_insert` (SIGSEGV),
//! and a 1-byte name was read past its end; a hostile server did the same
//! to clients. Each case here is a clear error that names the peer, on the
//! side that received the name, and the other side is told why.

use crate::common;
use common::*;
use fabric_msg::{connect, EndpointId, EventLoop, Listener, LoopConfig, Profile};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// A sockaddr_in of family `family`, 16 bytes.
fn sockaddr(family: i32, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    v[..2].copy_from_slice(&(family as u16).to_ne_bytes());
    v
}

/// Names a hostile peer might send on a provider with IPv4 socket addresses.
fn bad_socket_names() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    vec![
        ("empty", vec![], "empty"),
        ("one byte", vec![2], "16 bytes"),
        ("a byte short", sockaddr(libc::AF_INET, 15), "16 bytes"),
        ("a byte long", sockaddr(libc::AF_INET, 17), "16 bytes"),
        (
            "IPv6 family in 16 bytes",
            sockaddr(libc::AF_INET6, 16),
            "not IPv4",
        ),
        ("oversized", vec![0x41; 2000], "more than the 1024"),
    ]
}

/// Hand `bytes` to a listener serving on `ev` as a client would, and
/// return its error and what the client was told.
fn server_receives(ev: &mut EventLoop, ep: EndpointId, bytes: Vec<u8>) -> (String, String) {
    let listener = Listener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let client = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&bytes).unwrap();
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).ok();
        String::from_utf8_lossy(&answer).into_owned()
    });
    let e = listener.accept(ev, ep).unwrap_err().to_string();
    drop(listener);
    (e, client.join().unwrap())
}

#[test]
fn a_client_with_a_bad_address_gets_a_clear_error_not_a_crash() {
    let p = profile("tcp;ofi_rxm");
    // One server loop takes every hostile client in turn.
    let mut ev = EventLoop::new(&p, LoopConfig::default()).unwrap();
    let ep = ev.open_endpoint().unwrap();
    for (what, name, why) in bad_socket_names() {
        let (e, told) = server_receives(&mut ev, ep, hello(&p, name));
        assert!(
            e.contains("peer at 127.0.0.1:")
                && e.contains("address is not one tcp;ofi_rxm can use")
                && e.contains(why),
            "{what}: {e}"
        );
        assert!(
            told.contains("your endpoint address was refused"),
            "{what}: told {told:?}"
        );
    }
    // The same server loop survived all of them and still serves.
    let listener = Listener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let cp = p.clone();
    let client = std::thread::spawn(move || {
        let mut ev = EventLoop::new(&cp, LoopConfig::default()).unwrap();
        let ep = ev.open_endpoint().unwrap();
        connect(&mut ev, ep, addr, TIMEOUT).map(|_| ())
    });
    listener.accept(&mut ev, ep).unwrap();
    client.join().unwrap().unwrap();
}

/// shm names are strings: one without its NUL would be read to whatever
/// zero byte follows it in memory.
#[test]
fn shm_refuses_unterminated_and_foreign_string_addresses() {
    let p = profile("shm");
    // One loop throughout, as a real server has. (A fresh shm loop per
    // case was once refused with FI_EBUSY by fi_enable in a loaded CI run;
    // not understood yet, and not what this test is about.)
    let mut ev = EventLoop::new(&p, LoopConfig::default()).unwrap();
    let ep = ev.open_endpoint().unwrap();
    let own = ev.endpoint_name(ep).unwrap();
    assert_eq!(own.last(), Some(&0), "shm names are NUL-terminated: {own:?}");
    let mut unterminated = own.clone();
    unterminated.pop();
    let mut embedded = own.clone();
    embedded[3] = 0;
    for (what, name, why) in [
        ("empty", vec![], "empty"),
        ("unterminated", unterminated, "not NUL-terminated"),
        ("a NUL inside", embedded, "byte 0x00"),
        ("another scheme", b"fi_sock://10.0.0.1:7\0".to_vec(), "fi_sock://"),
    ] {
        let (e, told) = server_receives(&mut ev, ep, hello(&p, name));
        assert!(
            e.contains("address is not one shm can use") && e.contains(why),
            "{what}: {e}"
        );
        assert!(told.contains("refused"), "{what}: told {told:?}");
    }
}

/// A fake server that answers every client's hello with `name`.
fn hostile_server(p: &Profile, name: Vec<u8>) -> std::net::SocketAddr {
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    let answer = hello(p, name);
    std::thread::spawn(move || {
        let (mut s, _) = tcp.accept().unwrap();
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
        s.read_exact(&mut body).unwrap();
        s.write_all(&answer).unwrap();
        // Hold the connection until the client is done with it.
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).ok();
    });
    addr
}

fn client_error(p: &Profile, name: Vec<u8>) -> String {
    let addr = hostile_server(p, name);
    let mut ev = EventLoop::new(p, LoopConfig::default()).unwrap();
    let ep = ev.open_endpoint().unwrap();
    connect(&mut ev, ep, addr, Duration::from_secs(5))
        .unwrap_err()
        .to_string()
}

#[test]
fn a_hostile_server_cannot_crash_an_rdm_client() {
    let p = profile("tcp;ofi_rxm");
    for (what, name, why) in bad_socket_names() {
        let e = client_error(&p, name);
        assert!(e.contains("peer at 127.0.0.1:") && e.contains(why), "{what}: {e}");
    }
}

#[test]
fn a_hostile_server_cannot_crash_a_msg_client() {
    let p = msg_profile();
    for (what, name, why) in bad_socket_names() {
        let e = client_error(&p, name);
        assert!(
            e.contains("listening peer's address is not one tcp can use") && e.contains(why),
            "{what}: {e}"
        );
    }
}
