//! `pingpong`: fabric-msg's answer to fabtests' `fi_pingpong`.
//!
//! Server: `pingpong [options]`; client: `pingpong [options] ADDRESS`;
//! both in one process over 127.0.0.1: `pingpong --loopback`. Output has
//! fi_pingpong's columns; `usec/xfer` is one-way (elapsed / iterations / 2).

use fabric_msg::negotiate::{Capability, EndpointChoice};
use fabric_msg::{
    connect, negotiate, Buffer, Completion, EventLoop, LadderConfig, Listener, LoopConfig, OpKind, Peer,
    RecvOpts, Requirements, SendOpts, Token,
};
use std::process::ExitCode;
use std::time::{Duration, Instant};

const USAGE: &str = "\
usage: pingpong [options] [ADDRESS]

  -p PROVIDER     provider (default: negotiated)
  -d DOMAIN       domain, e.g. lo, rxe0
  -e rdm|msg      endpoint type (default rdm; msg implies --msg)
  -S SIZE|all     message size in bytes, or all (powers of two to 4 MiB; default all)
  -I ITERATIONS   iterations per size (default 1000)
  -W WARMUP       warm-up iterations per size (default 10)
  -B PORT         server: bootstrap port to listen on (default 9228)
  -P PORT         client: bootstrap port to connect to (default 9228)
  --msg           untagged messages (default tagged)
  --verify        check every received byte
  --borrowed      client sends from and receives into its own memory (unsafe API)
  --loopback      run server and client in this process over 127.0.0.1
  --same-host     peers share this host (allows shared memory)
  --json          JSON Lines output
  -h, --help      this text
";

#[derive(Clone)]
struct Opts {
    provider: Option<String>,
    domain: Option<String>,
    sizes: Vec<usize>,
    iters: usize,
    warmup: usize,
    bind_port: u16,
    port: u16,
    tagged: bool,
    endpoint: EndpointChoice,
    verify: bool,
    borrowed: bool,
    loopback: bool,
    same_host: bool,
    json: bool,
    address: Option<String>,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        provider: None,
        domain: None,
        sizes: all_sizes(),
        iters: 1000,
        warmup: 10,
        bind_port: 9228,
        port: 9228,
        tagged: true,
        endpoint: EndpointChoice::Rdm,
        verify: false,
        borrowed: false,
        loopback: false,
        same_host: false,
        json: false,
        address: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = |n: &str| it.next().ok_or_else(|| format!("{n} needs a value"));
        let num = |n: &str, v: String| v.parse::<usize>().map_err(|_| format!("{n} {v}: not a number"));
        match a.as_str() {
            "-p" => o.provider = Some(val("-p")?),
            "-d" => o.domain = Some(val("-d")?),
            "-S" => {
                let v = val("-S")?;
                o.sizes = if v == "all" {
                    all_sizes()
                } else {
                    vec![num("-S", v)?]
                };
            }
            "-I" => {
                o.iters = num("-I", val("-I")?)?;
                if o.iters == 0 {
                    return Err("-I 0: at least one iteration".into());
                }
            }
            "-W" => o.warmup = num("-W", val("-W")?)?,
            "-B" => o.bind_port = num("-B", val("-B")?)?.try_into().map_err(|_| "-B: not a port")?,
            "-P" => o.port = num("-P", val("-P")?)?.try_into().map_err(|_| "-P: not a port")?,
            "--msg" => o.tagged = false,
            "-e" => {
                o.endpoint = match val("-e")?.as_str() {
                    "rdm" => EndpointChoice::Rdm,
                    "msg" => {
                        o.tagged = false;
                        EndpointChoice::Msg
                    }
                    other => return Err(format!("-e {other}: expected rdm or msg")),
                }
            }
            "--verify" => o.verify = true,
            "--borrowed" => o.borrowed = true,
            "--loopback" => o.loopback = true,
            "--same-host" => o.same_host = true,
            "--json" => o.json = true,
            "-h" | "--help" => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            s if s.starts_with('-') => return Err(format!("unknown option `{s}`")),
            s => o.address = Some(s.to_string()),
        }
    }
    Ok(o)
}

fn all_sizes() -> Vec<usize> {
    let mut v = vec![1usize];
    while *v.last().unwrap() < 4 << 20 {
        v.push(v.last().unwrap() * 2);
    }
    v
}

fn main() -> ExitCode {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("pingpong: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pingpong: {e}");
            ExitCode::FAILURE
        }
    }
}

type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn run(o: &Opts) -> AnyResult<()> {
    let mut caps = vec![Capability::Msg];
    if o.tagged {
        caps.push(Capability::Tagged);
    }
    let req = Requirements {
        caps,
        endpoint: o.endpoint,
        provider: o.provider.clone(),
        domain: o.domain.clone(),
        same_host: o.same_host || o.loopback,
        ..Default::default()
    };
    let found = negotiate(&req, &LadderConfig::load(None)?)?;
    let profile = found.profile;
    if o.loopback {
        let listener = Listener::bind(("127.0.0.1", 0))?;
        let addr = listener.local_addr()?;
        let (sp, so) = (profile.clone(), o.clone());
        let server = std::thread::spawn(move || -> AnyResult<()> {
            let mut ev = EventLoop::new(&sp, LoopConfig::default())?;
            let peer = accept(&listener, &mut ev, &so)?;
            serve(&mut ev, &peer, &so)
        });
        let client = || -> AnyResult<()> {
            let mut ev = EventLoop::new(&profile, LoopConfig::default())?;
            let ep = ev.endpoint()?;
            let peer = connect(&mut ev, ep, addr, Duration::from_secs(10))?;
            header(o, &profile);
            drive(&mut ev, &peer, o)
        };
        if let Err(e) = client() {
            // A client that times out often does so because the server side
            // failed first: say so if it has, without waiting on it.
            std::thread::sleep(Duration::from_millis(200));
            if server.is_finished() {
                if let Ok(Err(s)) = server.join() {
                    return Err(format!("{e}; server side: {s}").into());
                }
            }
            return Err(e);
        }
        server.join().map_err(|_| "server thread panicked")?
    } else if let Some(host) = &o.address {
        let mut ev = EventLoop::new(&profile, LoopConfig::default())?;
        let ep = ev.endpoint()?;
        let peer = connect(&mut ev, ep, (host.as_str(), o.port), Duration::from_secs(10))?;
        header(o, &profile);
        drive(&mut ev, &peer, o)
    } else {
        let listener = Listener::bind(("0.0.0.0", o.bind_port))?;
        let mut ev = EventLoop::new(&profile, LoopConfig::default())?;
        let peer = accept(&listener, &mut ev, o)?;
        serve(&mut ev, &peer, o)
    }
}

fn header(o: &Opts, p: &fabric_msg::Profile) {
    if o.json {
        println!(
            "{}",
            serde_json::json!({"provider": p.provider, "fabric_kind": p.fabric_kind, "domain": p.domain,
                "endpoint_type": p.endpoint_type})
        );
    } else {
        println!(
            "# {} ({}) domain {} endpoint {}",
            p.provider, p.fabric_kind, p.domain, p.endpoint_type
        );
        println!(
            "{:<8} {:>8} {:>8} {:>8} {:>10} {:>10} {:>10} {:>12}",
            "bytes", "#sent", "#ack", "total", "time", "MB/sec", "usec/xfer", "Mxfers/sec"
        );
    }
}

fn opts(o: &Opts, i: usize) -> (SendOpts, RecvOpts) {
    let tag = o.tagged.then_some(i as u64 & 0xffff);
    (
        SendOpts { tag, data: None },
        RecvOpts {
            tag: tag.map(|t| (t, 0)),
            from: None,
        },
    )
}

fn fill(buf: &mut Buffer, seq: usize) {
    for (k, b) in buf.as_mut_slice().iter_mut().enumerate() {
        *b = (seq.wrapping_mul(131).wrapping_add(k)) as u8;
    }
}

fn check(buf: &Buffer, seq: usize, len: usize) -> AnyResult<()> {
    check_bytes(buf.as_slice(), seq, len)
}

fn check_bytes(bytes: &[u8], seq: usize, len: usize) -> AnyResult<()> {
    if bytes.len() != len {
        return Err(format!("iteration {seq}: received {} bytes, expected {len}", bytes.len()).into());
    }
    for (k, b) in bytes.iter().enumerate() {
        if *b != (seq.wrapping_mul(131).wrapping_add(k)) as u8 {
            return Err(format!("iteration {seq}: byte {k} of {len} is wrong").into());
        }
    }
    Ok(())
}

/// Wait for the completion of one operation kind, failing on errors.
fn wait(
    ev: &mut EventLoop,
    out: &mut Vec<Completion>,
    held: &mut Vec<Completion>,
    kind: OpKind,
) -> AnyResult<Completion> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(i) = held.iter().position(|c| c.kind == kind) {
            let c = held.swap_remove(i);
            c.result.clone().map_err(|e| format!("{kind:?} failed: {e}"))?;
            return Ok(c);
        }
        if Instant::now() > deadline {
            return Err(format!("no {kind:?} completion within 30 s: is the peer alive?").into());
        }
        ev.poll(out, Some(Duration::from_millis(100)))?;
        held.append(out);
    }
}

/// Accept one client, with the first receive posted before it can send.
fn accept(listener: &Listener, ev: &mut EventLoop, o: &Opts) -> AnyResult<Peer> {
    let ep = ev.endpoint()?;
    let mut first = Some(Buffer::new(max_size(o)));
    let r = opts(o, 0).1;
    Ok(listener.accept_with(ev, ep, |ev, e| {
        let b = first.take().expect("one endpoint per accept");
        ev.recv(e, b, r, Token(1)).map_err(Into::into)
    })?)
}

fn max_size(o: &Opts) -> usize {
    *o.sizes.iter().max().unwrap_or(&1)
}

/// Echo every message. The receive for the next message is posted before
/// the reply goes out: iWARP drops a connection whose message finds no
/// receive posted.
fn serve(ev: &mut EventLoop, peer: &Peer, o: &Opts) -> AnyResult<()> {
    let (mut out, mut held) = (Vec::new(), Vec::new());
    let mut spare = Some(Buffer::new(max_size(o)));
    let rounds: Vec<(usize, usize)> = o
        .sizes
        .iter()
        .flat_map(|&size| (0..o.warmup + o.iters).map(move |i| (size, i)))
        .collect();
    for (n, &(size, i)) in rounds.iter().enumerate() {
        let mut got = wait(ev, &mut out, &mut held, OpKind::Recv)?
            .buffer
            .expect("buffer");
        if o.verify {
            check(&got, i, size)?;
        }
        if let Some(&(_, next)) = rounds.get(n + 1) {
            let mut b = spare.take().expect("spare buffer");
            b.set_len(b.capacity());
            ev.recv(peer.endpoint(), b, opts(o, next).1, Token(1))?;
        }
        got.set_len(size);
        ev.send(peer, got, opts(o, i).0, Token(2))?;
        spare = wait(ev, &mut out, &mut held, OpKind::Send)?.buffer;
    }
    Ok(())
}

fn drive(ev: &mut EventLoop, peer: &Peer, o: &Opts) -> AnyResult<()> {
    if o.borrowed {
        return drive_borrowed(ev, peer, o);
    }
    let (mut out, mut held) = (Vec::new(), Vec::new());
    let max = max_size(o);
    let (mut tx, mut rx) = (Some(Buffer::new(max)), Some(Buffer::new(max)));
    for &size in &o.sizes {
        let mut start = Instant::now();
        for i in 0..o.warmup + o.iters {
            if i == o.warmup {
                start = Instant::now();
            }
            let (s, r) = opts(o, i);
            let mut b = rx.take().expect("buffer");
            b.set_len(b.capacity());
            ev.recv(peer.endpoint(), b, r, Token(1))?;
            let mut t = tx.take().expect("buffer");
            t.set_len(size);
            if o.verify {
                fill(&mut t, i);
            }
            ev.send(peer, t, s, Token(2))?;
            tx = wait(ev, &mut out, &mut held, OpKind::Send)?.buffer;
            let got = wait(ev, &mut out, &mut held, OpKind::Recv)?
                .buffer
                .expect("buffer");
            if o.verify {
                check(&got, i, size)?;
            }
            rx = Some(got);
        }
        report(o, size, start.elapsed());
    }
    Ok(())
}

/// The client loop on its own memory: `send_borrowed` / `recv_borrowed`.
fn drive_borrowed(ev: &mut EventLoop, peer: &Peer, o: &Opts) -> AnyResult<()> {
    let (mut out, mut held) = (Vec::new(), Vec::new());
    let max = max_size(o);
    let (mut tx, mut rx) = (vec![0u8; max], vec![0u8; max]);
    for &size in &o.sizes {
        let mut start = Instant::now();
        for i in 0..o.warmup + o.iters {
            if i == o.warmup {
                start = Instant::now();
            }
            let (s, r) = opts(o, i);
            if o.verify {
                for (k, b) in tx[..size].iter_mut().enumerate() {
                    *b = (i.wrapping_mul(131).wrapping_add(k)) as u8;
                }
            }
            // SAFETY: `tx` and `rx` are not touched until both completions
            // below have been returned by poll (or this function fails, after
            // which the loop is dropped before the vectors).
            unsafe {
                ev.recv_borrowed(peer.endpoint(), rx.as_mut_ptr(), max, r, Token(1))?;
                ev.send_borrowed(peer, tx.as_ptr(), size, s, Token(2))?;
            }
            wait(ev, &mut out, &mut held, OpKind::Send)?;
            let got = wait(ev, &mut out, &mut held, OpKind::Recv)?;
            let (_, len) = got.multi.ok_or("a borrowed receive reports its length")?;
            if o.verify {
                check_bytes(&rx[..len], i, size)?;
            }
        }
        report(o, size, start.elapsed());
    }
    Ok(())
}

fn report(o: &Opts, size: usize, elapsed: Duration) {
    let n = o.iters as f64;
    let secs = elapsed.as_secs_f64();
    let usec = secs * 1e6 / n / 2.0;
    let mbps = (2.0 * n * size as f64) / secs / 1e6;
    let mxfers = 2.0 * n / secs / 1e6;
    if o.json {
        println!(
            "{}",
            serde_json::json!({"bytes": size, "iters": o.iters, "usec_per_xfer": usec, "mb_per_sec": mbps,
                "total_bytes": 2 * o.iters * size, "seconds": secs})
        );
    } else {
        let total = 2 * o.iters * size;
        let total = if total >= 1 << 20 {
            format!("{}m", total >> 20)
        } else {
            format!("{}k", total >> 10)
        };
        println!(
            "{:<8} {:>8} {:>8} {:>8} {:>9.2}s {:>10.2} {:>10.2} {:>12.2}",
            size, o.iters, o.iters, total, secs, mbps, usec, mxfers
        );
    }
}
