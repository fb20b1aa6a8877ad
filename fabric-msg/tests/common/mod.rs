//! Helpers shared by the messaging tests: negotiate a provider, open a
//! server and a client loop connected through the bootstrap, drive polls.

#![allow(dead_code)]

use fabric_msg::discovery::negotiate::{Capability, EndpointChoice, Requirements};
use fabric_msg::{
    connect, negotiate, Buffer, Completion, EndpointId, EventLoop, LadderConfig, Listener, LoopConfig,
    OpKind, Peer, Profile, RecvOpts, SendOpts, Token,
};
use std::time::{Duration, Instant};

pub const TIMEOUT: Duration = Duration::from_secs(20);

/// Whether the running libfabric gives `tcp` RDM endpoints of its own:
/// from 1.18, when the `net` provider was merged into `tcp` (and `net`
/// stopped being listed).
pub fn tcp_has_rdm() -> bool {
    fabric_msg::ffi::runtime_version() >= (1, 18)
}

/// Say loudly that a test did not run, and why: straight to stderr, past
/// the test harness's capture (which would hide it in a passing test).
pub fn skipped(test: &str, why: &str) {
    use std::io::Write;
    let (major, minor) = fabric_msg::ffi::runtime_version();
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test} on libfabric {major}.{minor}: {why}"
    );
}

/// Negotiate `provider` for tagged and untagged RDM messaging.
pub fn profile(provider: &str) -> Profile {
    profile_with(provider, 256)
}

pub fn profile_with(provider: &str, queue_depth: usize) -> Profile {
    negotiate_for(provider, &[Capability::Tagged, Capability::Msg], queue_depth)
}

fn negotiate_for(provider: &str, caps: &[Capability], queue_depth: usize) -> Profile {
    let req = Requirements {
        caps: caps.to_vec(),
        endpoint: EndpointChoice::Rdm,
        provider: Some(provider.into()),
        domain: Some(if provider == "shm" {
            "shm".into()
        } else {
            "lo".into()
        }),
        same_host: provider == "shm",
        queue_depth,
        ..Default::default()
    };
    negotiate(&req, &LadderConfig::default())
        .unwrap_or_else(|e| panic!("negotiating {provider}: {e}"))
        .profile
}

pub struct Side {
    pub ev: EventLoop,
    pub ep: EndpointId,
    pub peer: Peer,
}

/// A server thread's and a client's loop, connected through the bootstrap.
/// `serve` runs on the server's thread with its connected side.
pub fn pair<T: Send + 'static>(
    server_profile: Profile,
    client_profile: Profile,
    cfg: LoopConfig,
    serve: impl FnOnce(Side) -> T + Send + 'static,
) -> (Side, std::thread::JoinHandle<T>) {
    let listener = Listener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let scfg = cfg.clone();
    let server = std::thread::spawn(move || {
        let mut ev = EventLoop::new(&server_profile, scfg).expect("server loop");
        let ep = ev.open_endpoint().expect("server endpoint");
        let peer = listener.accept(&mut ev, ep).expect("accept");
        serve(Side { ev, ep, peer })
    });
    let mut ev = EventLoop::new(&client_profile, cfg).expect("client loop");
    let ep = ev.open_endpoint().expect("client endpoint");
    let peer = connect(&mut ev, ep, addr, TIMEOUT).expect("connect");
    (Side { ev, ep, peer }, server)
}

/// The old value a fetching atomic's completion carries. A failed one
/// carries none: its error and token go into the panic (a compare-swap
/// under load in CI once completed without a value, and its test said no
/// more).
pub fn fetched_value(c: &Completion, what: &str) -> u64 {
    match (&c.result, c.value) {
        (Ok(()), Some(v)) => v,
        (r, v) => panic!("{what} ({:?}): completed with {r:?} and value {v:?}", c.token),
    }
}

/// Poll until `n` completions arrived (panics after TIMEOUT).
pub fn wait_n(ev: &mut EventLoop, n: usize) -> Vec<Completion> {
    let mut got = Vec::new();
    let mut batch = Vec::new();
    let deadline = Instant::now() + TIMEOUT;
    while got.len() < n {
        let left = deadline
            .checked_duration_since(Instant::now())
            .unwrap_or_else(|| {
                panic!(
                    "timed out: {} of {n} completions ({} in flight)",
                    got.len(),
                    ev.in_flight()
                )
            });
        ev.poll(&mut batch, Some(left.min(Duration::from_millis(100))))
            .expect("poll");
        got.append(&mut batch);
    }
    got
}

/// A recognisable byte pattern for message `seq` of `len` bytes.
pub fn pattern(seq: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seq as usize).wrapping_mul(31).wrapping_add(i * 7) as u8)
        .collect()
}

/// Negotiate `provider` with other capabilities.
pub fn profile_caps(provider: &str, caps: &[Capability]) -> Profile {
    negotiate_for(provider, caps, Requirements::default().queue_depth)
}

/// Negotiate `provider` for messages, RMA and atomics.
pub fn atomic_profile(provider: &str) -> Profile {
    profile_caps(
        provider,
        &[
            Capability::Tagged,
            Capability::Msg,
            Capability::Rma,
            Capability::Atomic,
        ],
    )
}

/// Two loops of profile `p` opened to sleep (`WaitMode::Block`: a wait fd
/// where the provider has one) and connected through the bootstrap: the
/// client's, the server's.
pub fn sleeping_pair(p: Profile) -> (Side, Side) {
    sleeping_pair_with(p, LoopConfig::default())
}

/// A [`sleeping_pair`] for untagged messages into multi-receive buffers,
/// which stay posted while 64 bytes of room are left.
pub fn multi_recv_pair(provider: &str) -> (Side, Side) {
    let cfg = LoopConfig {
        min_multi_recv: Some(64),
        ..LoopConfig::default()
    };
    sleeping_pair_with(
        profile_caps(provider, &[Capability::Msg, Capability::MultiRecv]),
        cfg,
    )
}

/// [`sleeping_pair`] with the rest of `cfg`.
pub fn sleeping_pair_with(p: Profile, cfg: LoopConfig) -> (Side, Side) {
    let cfg = LoopConfig {
        wait: fabric_msg::WaitMode::Block,
        ..cfg
    };
    let (me, server) = pair(p.clone(), p, cfg, |s| s);
    (me, server.join().unwrap())
}

/// A client loop connected to `addr`.
pub fn client(p: &Profile, addr: std::net::SocketAddr) -> Side {
    let mut ev = EventLoop::new(p, LoopConfig::default()).expect("client loop");
    let ep = ev.open_endpoint().expect("client endpoint");
    let peer = connect(&mut ev, ep, addr, TIMEOUT).expect("connect");
    Side { ev, ep, peer }
}

/// The handshake frames as fabric-msg writes them, for crafting hostile
/// ones (postcard encodes the variant's index, so the order matters).
#[derive(serde::Serialize, serde::Deserialize)]
pub enum Frame {
    Hello {
        magic: u32,
        version: u16,
        profile: fabric_msg::discovery::profile::WireProfile,
        name: Vec<u8>,
        /// The server's per-handshake nonce on connected endpoints, which
        /// the client's `fi_connect` carries; 0 otherwise.
        nonce: u64,
    },
    Reject {
        reason: String,
    },
    Ready,
}

/// The handshake's magic number.
pub const MAGIC: u32 = 0x464d_5347;

/// A frame's bytes with their length in front, as the bootstrap sends them.
pub fn framed(body: &[u8]) -> Vec<u8> {
    let mut v = (body.len() as u32).to_le_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

/// A `Hello` from `profile`'s provider carrying `name` as its address.
pub fn hello(profile: &Profile, name: Vec<u8>) -> Vec<u8> {
    framed(
        &postcard::to_stdvec(&Frame::Hello {
            magic: MAGIC,
            version: fabric_msg::discovery::profile::PROTOCOL_VERSION,
            profile: profile.wire(),
            name,
            nonce: 0,
        })
        .unwrap(),
    )
}

/// tcp's connected (MSG) endpoints on loopback, untagged.
pub fn msg_profile() -> Profile {
    let req = Requirements {
        caps: vec![Capability::Msg],
        endpoint: EndpointChoice::Msg,
        provider: Some("tcp".into()),
        domain: Some("lo".into()),
        ..Default::default()
    };
    let p = negotiate(&req, &LadderConfig::default()).unwrap().profile;
    assert_eq!(p.endpoint_type, fabric_msg::EndpointType::Msg);
    p
}

/// Send `bytes` to `peer` with `tag` (the token is the tag) and wait for
/// the send's completion, the only one expected.
pub fn send_tagged(ev: &mut EventLoop, peer: &Peer, tag: u64, bytes: &[u8]) {
    let opts = SendOpts {
        tag: Some(tag),
        data: None,
    };
    ev.send(peer, Buffer::from_slice(bytes), opts, Token(tag))
        .unwrap();
    let c = wait_n(ev, 1).remove(0);
    assert_eq!((c.kind, c.token), (OpKind::Send, Token(tag)));
    c.result.unwrap();
}

/// Receive one message with exactly `tag` (at most 4 KiB) on `ep`.
pub fn recv_tagged(ev: &mut EventLoop, ep: EndpointId, tag: u64) -> Vec<u8> {
    let opts = RecvOpts {
        tag: Some((tag, 0)),
        from: None,
    };
    ev.recv(ep, Buffer::new(4096), opts, Token(tag)).unwrap();
    let c = wait_n(ev, 1).remove(0);
    c.result.unwrap();
    c.buffer.unwrap().as_slice().to_vec()
}

/// The name libtest gives test `f` of the module whose `module_path!()` is
/// `module`: that path without the crate's name, so `rma::f` in the
/// integration binary and `f` in a binary of its own. For a test that runs
/// one of its own tests as a child process (`--exact NAME --ignored`).
pub fn test_name(module: &str, f: &str) -> String {
    match module.split_once("::") {
        Some((_, m)) => format!("{m}::{f}"),
        None => f.to_string(),
    }
}

/// Poll `f` once, in the calling task: its output if it was ready. For a
/// future of the async adapter, the one poll posts its operation.
#[cfg(feature = "tokio")]
pub async fn poll_once<F: std::future::Future + Unpin>(f: &mut F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut *f).poll(cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        })
    })
    .await
}
