//! `atomics`: a server holds a u64 counter in registered memory; clients
//! increment it with fetch-adds and compare-and-swaps; the server checks
//! that it ends at exactly the number of increments and that every old
//! value a client saw was seen once. Natively where the provider has
//! atomics, emulated by fabric-msg where it has not (the profile says
//! which; `--emulated` / `--native` choose).
//!
//! Server: `atomics [options]`; client: `atomics [options] ADDRESS`;
//! server and clients in one process over 127.0.0.1: `atomics --loopback`.
//! Exits non-zero on a wrong total.

use fabric_msg::discovery::atomic::AtomicCarrier;
use fabric_msg::discovery::negotiate::{Capability, EndpointChoice};
use fabric_msg::{
    connect, negotiate, Access, Atomic, AtomicKind, AtomicPolicy, Buffer, Completion, EventLoop,
    LadderConfig, Listener, LoopConfig, Peer, Profile, RecvOpts, Requirements, SendOpts, Token, WaitMode,
};
use fabric_msg_examples::output::atomic_op_name;
use fabric_msg_examples::session::accept_serving;
use std::process::ExitCode;
use std::time::{Duration, Instant};

type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const DESCRIPTOR: u64 = 1;
const DONE: u64 = 2;
const FA: u64 = 1 << 32;
const CAS: u64 = 2 << 32;
const SEND: u64 = 3 << 32;
/// How long any one wait may take before the run fails.
const PATIENCE: Duration = Duration::from_secs(120);

const USAGE: &str = "\
usage: atomics [options] [ADDRESS]
A server holds a counter; clients increment it by fetch-add and
compare-and-swap; the server checks the total. Without ADDRESS: server;
with it: client. Exits 1 on a wrong total.

  -p PROVIDER     provider, as fabtests means it: tcp admits 'tcp;ofi_rxm'
  -d DOMAIN       domain, e.g. lo, rxe0
  -e rdm|msg      endpoint type (default rdm; emulation needs rdm)
  -B PORT         server: out-of-band port to listen on (default 9228; 0: any, printed)
  -P PORT         client: the server's out-of-band port (default 9228)
  -I INCREMENTS   increments per client, half of each kind (default 1000)
  -C CLIENTS      clients (the server waits for this many; default 1, 3 with --loopback)
  -w WINDOW       fetch-adds each client keeps in flight (default 1: then
                  usec/op is the latency of one atomic)
  -c spin|fd      completion wait: spin on the CQ (default) or sleep on its fd
  --native        only the provider's own atomics (AtomicPolicy::Native)
  --emulated      fabric-msg's emulation even where the provider has atomics
  --loopback      server and clients in this process over 127.0.0.1
  --same-host     peers share this host (allows shared memory)
  --json          JSON Lines: the fabric, one object per client, the result
  -h, --help      this text

Give every side the same -p, -e, -C, --native/--emulated.
";

#[derive(Debug, Clone)]
struct Opts {
    provider: Option<String>,
    domain: Option<String>,
    endpoint: EndpointChoice,
    bind_port: u16,
    port: u16,
    increments: u64,
    clients: Option<u64>,
    window: u64,
    wait: WaitMode,
    policy: AtomicPolicy,
    loopback: bool,
    same_host: bool,
    json: bool,
    address: Option<String>,
}

fn parse(args: impl Iterator<Item = String>) -> Result<Option<Opts>, String> {
    let mut o = Opts {
        provider: None,
        domain: None,
        endpoint: EndpointChoice::Rdm,
        bind_port: 9228,
        port: 9228,
        increments: 1000,
        clients: None,
        window: 1,
        wait: WaitMode::Spin,
        policy: AtomicPolicy::Auto,
        loopback: false,
        same_host: false,
        json: false,
        address: None,
    };
    let mut args = args.peekable();
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        let number =
            |name: &str, v: String| v.parse::<u64>().map_err(|_| format!("{name}: not a number: {v}"));
        match a.as_str() {
            "-h" | "--help" => return Ok(None),
            "-p" => o.provider = Some(value("-p")?),
            "-d" => o.domain = Some(value("-d")?),
            "-e" => {
                o.endpoint = match value("-e")?.as_str() {
                    "rdm" => EndpointChoice::Rdm,
                    "msg" => EndpointChoice::Msg,
                    other => return Err(format!("-e: rdm or msg, not {other}")),
                }
            }
            "-B" => o.bind_port = number("-B", value("-B")?)?.try_into().map_err(|_| "-B: port")?,
            "-P" => o.port = number("-P", value("-P")?)?.try_into().map_err(|_| "-P: port")?,
            "-I" => o.increments = number("-I", value("-I")?)?,
            "-C" => o.clients = Some(number("-C", value("-C")?)?.max(1)),
            "-w" => o.window = number("-w", value("-w")?)?.max(1),
            "-c" => {
                o.wait = match value("-c")?.as_str() {
                    "spin" => WaitMode::Spin,
                    "fd" => WaitMode::Block,
                    other => return Err(format!("-c: spin or fd, not {other}")),
                }
            }
            "--native" => o.policy = AtomicPolicy::Native,
            "--emulated" => o.policy = AtomicPolicy::Emulated,
            "--loopback" => o.loopback = true,
            "--same-host" => o.same_host = true,
            "--json" => o.json = true,
            s if s.starts_with('-') => return Err(format!("unknown option {s}")),
            s if o.address.is_none() => o.address = Some(s.to_string()),
            s => return Err(format!("one ADDRESS only, not also {s}")),
        }
    }
    if o.loopback && o.address.is_some() {
        return Err("--loopback takes no ADDRESS".into());
    }
    Ok(Some(o))
}

fn main() -> ExitCode {
    let o = match parse(std::env::args().skip(1)) {
        Ok(Some(o)) => o,
        Ok(None) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("atomics: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&o) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("atomics: {e}");
            ExitCode::FAILURE
        }
    }
}

fn requirements(o: &Opts) -> Requirements {
    // Tagged messages carry emulated atomics (RDM); connected endpoints
    // (verbs MSG) can only have native ones, untagged.
    let mut caps = vec![Capability::Msg, Capability::Atomic];
    if o.endpoint != EndpointChoice::Msg {
        caps.push(Capability::Tagged);
    }
    Requirements {
        caps,
        endpoint: o.endpoint,
        provider: o.provider.clone(),
        provider_layered: true,
        domain: o.domain.clone(),
        same_host: o.same_host || o.loopback,
        atomics: o.policy,
        ..Default::default()
    }
}

fn loop_config(o: &Opts) -> LoopConfig {
    LoopConfig {
        wait: o.wait,
        ..Default::default()
    }
}

/// Print the fabric and how atomics are carried.
fn header(o: &Opts, p: &Profile) {
    let carriers: Vec<String> = p
        .atomic_carriers()
        .iter()
        .map(|(op, c)| format!("{}={c}", atomic_op_name(*op)))
        .collect();
    if o.json {
        let by_op: serde_json::Map<String, serde_json::Value> = p
            .atomic_carriers()
            .iter()
            .map(|(op, c)| (atomic_op_name(*op).to_string(), c.to_string().into()))
            .collect();
        println!(
            "{}",
            serde_json::json!({"tool": "atomics", "provider": p.provider, "fabric_kind": p.fabric_kind,
                "domain": p.domain, "endpoint_type": p.endpoint_type, "atomics": by_op})
        );
    } else {
        println!(
            "# {} ({}) domain {} endpoint {}, atomics: {}",
            p.provider,
            p.fabric_kind,
            p.domain,
            p.endpoint_type,
            carriers.join(" ")
        );
    }
}

fn run(o: &Opts) -> AnyResult<bool> {
    let profile = negotiate(&requirements(o), &LadderConfig::load(None)?)?.profile;
    for op in [AtomicKind::FetchAdd, AtomicKind::CompareSwap] {
        if profile.atomic_carrier(op).is_none() {
            return Err(format!("{} carries no {op} here", profile.provider).into());
        }
    }
    header(o, &profile);
    if o.loopback {
        let clients = o.clients.unwrap_or(3);
        let listener = Listener::bind(("127.0.0.1", 0))?;
        let addr = listener.local_addr()?;
        let (sp, so) = (profile.clone(), o.clone());
        let server = std::thread::spawn(move || serve(&sp, &so, listener, clients));
        let threads: Vec<_> = (0..clients)
            .map(|id| {
                let (p, o) = (profile.clone(), o.clone());
                std::thread::spawn(move || drive(&p, &o, addr, id))
            })
            .collect();
        // Every loop is kept until all sides are done: in one process shm
        // reaches a peer's endpoint memory directly.
        let mut loops = Vec::new();
        let mut first_error = None;
        for t in threads {
            match t.join().map_err(|_| "a client panicked")? {
                Ok(ev) => loops.push(ev),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        let served = server.join().map_err(|_| "the server panicked")?;
        // A client's failure is the cause; the server then only sees
        // silence ("no word ... in 120s"), so the client's error comes first.
        if let Some(e) = first_error {
            return Err(match served {
                Err(s) => format!("{e} (and the server: {s})").into(),
                Ok(_) => e,
            });
        }
        let (ok, ev) = served?;
        loops.push(ev);
        return Ok(ok);
    }
    match &o.address {
        None => {
            let listener = Listener::bind(("0.0.0.0", o.bind_port))?;
            if o.bind_port == 0 {
                eprintln!("listening on port {}", listener.local_addr()?.port());
            }
            Ok(serve(&profile, o, listener, o.clients.unwrap_or(1))?.0)
        }
        Some(host) => {
            let addr = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), o.port))?
                .next()
                .ok_or(format!("{host}: no address"))?;
            drive(&profile, o, addr, 0)?;
            Ok(true)
        }
    }
}

/// The tool's own messages: tagged where the fabric has tags.
fn tagged(ev: &EventLoop) -> bool {
    ev.profile().caps_granted.iter().any(|c| c == "FI_TAGGED")
}

/// Send and wait for the send's completion; others are kept in `stash`.
fn send_tagged(
    ev: &mut EventLoop,
    peer: &Peer,
    tag: u64,
    bytes: &[u8],
    stash: &mut Vec<Completion>,
) -> AnyResult<()> {
    let opts = SendOpts {
        tag: tagged(ev).then_some(tag),
        data: None,
    };
    let token = Token(SEND | tag);
    ev.send(peer, Buffer::from_slice(bytes), opts, token)
        .map_err(|e| e.error)?;
    wait_for(ev, token, stash)?.result?;
    Ok(())
}

/// Wait for the completion of `token`; others are kept in `stash`.
fn wait_for(ev: &mut EventLoop, token: Token, stash: &mut Vec<Completion>) -> AnyResult<Completion> {
    let mut batch = Vec::new();
    let deadline = Instant::now() + PATIENCE;
    loop {
        if Instant::now() > deadline {
            return Err(format!("no completion within {PATIENCE:?}").into());
        }
        ev.poll(&mut batch, Some(Duration::from_millis(100)))?;
        let mut found = None;
        for c in batch.drain(..) {
            if c.token == token && found.is_none() {
                found = Some(c);
            } else {
                stash.push(c);
            }
        }
        if let Some(c) = found {
            return Ok(c);
        }
    }
}

/// The server: accept `clients`, hand each the counter, poll (applying
/// emulated atomics) until each says DONE with its count, check the total.
fn serve(p: &Profile, o: &Opts, listener: Listener, clients: u64) -> AnyResult<(bool, EventLoop)> {
    let mut ev = EventLoop::new(p, loop_config(o))?;
    let ep = ev.open_endpoint()?;
    let counter = ev.register(8, Access::ReadWrite)?;
    let mut peers = Vec::new();
    for _ in 0..clients {
        peers.push(accept_serving("atomics", &listener, &mut ev, ep, |_, _| Ok(()))?);
    }
    for (i, peer) in peers.iter().enumerate() {
        let opts = RecvOpts {
            tag: tagged(&ev).then_some((DONE, 0)),
            from: None,
        };
        ev.recv(peer.endpoint(), Buffer::new(64), opts, Token(DONE + i as u64))
            .map_err(|e| e.error)?;
    }
    // DONE messages of quick clients may complete while descriptors are
    // still being sent: they wait in `batch`.
    let mut batch = Vec::new();
    for peer in &peers {
        send_tagged(&mut ev, peer, DESCRIPTOR, &counter.remote().encode(), &mut batch)?;
    }
    let mut claimed = 0u64;
    let mut done = 0;
    let mut last = Instant::now();
    while done < clients {
        if batch.is_empty() {
            ev.poll(&mut batch, Some(Duration::from_millis(100)))?;
        }
        for c in batch.drain(..) {
            c.result?;
            let b = c.buffer.ok_or("a DONE message without its buffer")?;
            let n: [u8; 8] = b
                .as_slice()
                .try_into()
                .map_err(|_| "a DONE message of the wrong size")?;
            claimed += u64::from_le_bytes(n);
            done += 1;
            last = Instant::now();
        }
        if last.elapsed() > PATIENCE {
            return Err(format!(
                "{done} of {clients} clients finished; no word from the rest in {PATIENCE:?}"
            )
            .into());
        }
    }
    let mut w = [0u8; 8];
    counter.read_at(0, &mut w)?;
    let total = u64::from_le_bytes(w);
    let expected = clients * o.increments;
    let ok = total == expected && claimed == expected;
    if o.json {
        println!(
            "{}",
            serde_json::json!({"counter": total, "expected": expected, "claimed": claimed, "ok": ok})
        );
    } else {
        println!(
            "counter {total}, expected {expected} ({clients} clients x {} increments): {}",
            o.increments,
            if ok { "ok" } else { "WRONG" }
        );
    }
    if !ok {
        eprintln!("atomics: the counter is {total}, clients claim {claimed}, expected {expected}");
    }
    Ok((ok, ev))
}

/// One client: half the increments by fetch-add (a window in flight),
/// half by compare-and-swap; checks that every old value it saw is new.
fn drive(p: &Profile, o: &Opts, addr: std::net::SocketAddr, id: u64) -> AnyResult<EventLoop> {
    let mut ev = EventLoop::new(p, loop_config(o))?;
    let ep = ev.open_endpoint()?;
    let peer = connect(&mut ev, ep, addr, PATIENCE)?;
    let opts = RecvOpts {
        tag: tagged(&ev).then_some((DESCRIPTOR, 0)),
        from: None,
    };
    ev.recv(peer.endpoint(), Buffer::new(4096), opts, Token(DESCRIPTOR))
        .map_err(|e| e.error)?;
    let mut stray = Vec::new();
    let c = wait_for(&mut ev, Token(DESCRIPTOR), &mut stray)?;
    c.result?;
    let remote = ev.import(c.buffer.ok_or("descriptor without buffer")?.as_slice())?;
    let n = o.increments;
    let (fa_total, cas_total) = (n / 2, n - n / 2);
    let (mut fa_posted, mut fa_done, mut cas_done, mut cas_tries) = (0u64, 0u64, 0u64, 0u64);
    let (mut guess, mut cas_in_flight) = (0u64, false);
    let mut seen = Vec::with_capacity(n as usize);
    let mut batch = Vec::new();
    let started = Instant::now();
    let mut last = Instant::now();
    while fa_done < fa_total || cas_done < cas_total {
        while fa_posted < fa_total && fa_posted - fa_done < o.window {
            ev.atomic(&peer, Atomic::FetchAdd(1), &remote, 0, Token(FA | fa_posted))?;
            fa_posted += 1;
        }
        // Compare-and-swap after the fetch-adds with a window of 1, so
        // that -w 1 measures one operation at a time.
        let cas_turn = o.window > 1 || fa_done == fa_total;
        if cas_turn && !cas_in_flight && cas_done < cas_total {
            let cas = Atomic::CompareSwap {
                expected: guess,
                new: guess + 1,
            };
            ev.atomic(&peer, cas, &remote, 0, Token(CAS))?;
            cas_in_flight = true;
            cas_tries += 1;
        }
        ev.poll(&mut batch, Some(Duration::from_millis(100)))?;
        for c in batch.drain(..) {
            c.result.map_err(|e| format!("atomic {:#x}: {e}", c.token.0))?;
            let old = c.value.ok_or("a fetching atomic returned no value")?;
            last = Instant::now();
            if c.token == Token(CAS) {
                cas_in_flight = false;
                if old == guess {
                    seen.push(old);
                    cas_done += 1;
                    guess = old + 1;
                } else {
                    guess = old;
                }
            } else {
                seen.push(old);
                fa_done += 1;
            }
        }
        if last.elapsed() > PATIENCE {
            return Err(format!(
                "client {id}: {fa_done}/{fa_total} fetch-adds, {cas_done}/{cas_total} compare-swaps; \
                 nothing completed in {PATIENCE:?} (is the server polling?)"
            )
            .into());
        }
    }
    let elapsed = started.elapsed();
    seen.sort_unstable();
    if seen.windows(2).any(|w| w[0] == w[1]) {
        return Err(format!("client {id}: two increments saw the same old value: not atomic").into());
    }
    let ops = fa_total + cas_tries;
    let usec = elapsed.as_secs_f64() * 1e6 / ops.max(1) as f64;
    let carrier = p
        .atomic_carrier(AtomicKind::FetchAdd)
        .unwrap_or(AtomicCarrier::Native);
    if o.json {
        println!(
            "{}",
            serde_json::json!({"client": id, "fetch_adds": fa_total, "compare_swaps": cas_done,
                "compare_swap_tries": cas_tries, "seconds": elapsed.as_secs_f64(), "usec_per_op": usec,
                "carrier": carrier.to_string(), "window": o.window})
        );
    } else {
        println!(
            "client {id}: {fa_total} fetch-adds, {cas_done} compare-swaps ({cas_tries} tries), {:.3} s, \
             {usec:.2} usec/op ({carrier}, window {})",
            elapsed.as_secs_f64(),
            o.window
        );
    }
    send_tagged(&mut ev, &peer, DONE, &n.to_le_bytes(), &mut stray)?;
    Ok(ev)
}
