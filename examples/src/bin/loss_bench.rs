//! `loss_bench`: how long an `EventLoop` takes to report a lost peer, and
//! what the first operation to that peer costs afterwards.
//!
//! Each trial starts a peer process (this program, `--peer`), accepts it
//! through the bootstrap listener, receives its hello, then signals it:
//! SIGKILL (the process ends: the kernel closes its lifeline, reported as
//! `Died`) or SIGSTOP (it lives but sends nothing, not even a heartbeat:
//! reported as `Silent` once nothing was heard for `peer_timeout`, counted
//! from the last heartbeat, which came up to 250 ms before the stop: so
//! between `peer_timeout` less 250 ms and a little more). The detection time
//! runs from `kill(2)`'s return to the `PeerLost` completion, polled the
//! way an application polls (`poll` with a 1 ms timeout). Then one send to
//! the lost peer: the time until it is refused (`Error::PeerLost`) is the
//! first operation's. p50, p99 and max over the trials, per provider and
//! kind; `--json` gives one object each.
//!
//! ```text
//! loss_bench                                   # 50 trials each: kill and stop, tcp;ofi_rxm and shm
//! loss_bench --trials 10 -p shm --kinds kill --json
//! ```

use fabric_msg::{
    negotiate, Buffer, Completion, EventLoop, LadderConfig, Listener, LoopConfig, Profile, RecvOpts,
    SendOpts, Token,
};
use fabric_msg_examples::opts::{parse, Parsed, Tool};
use fabric_msg_examples::say;
use fabric_msg_examples::stats::Tail;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

const USAGE: &str = "\
usage: loss_bench [--trials N] [-p PROVIDERS] [--kinds KINDS] [--timeout-ms T] [--json]
How long a lost peer takes to be reported (PeerLost) and how long the first
send to it takes to be refused, over N trials (default 50) of a peer process
killed (SIGKILL) or stopped (SIGSTOP).

  -p PROVIDERS    comma list (default tcp;ofi_rxm,shm); tcp providers use lo
  --kinds KINDS   kill, stop or kill,stop (default both)
  --timeout-ms T  the loop's peer_timeout: how long a silent peer is waited
                  for (default 1000, the least it takes)
  --json          one JSON object per provider and kind
  -h, --help      this text";

/// How long any one step (a peer's start, its hello, a notice) may take.
const STEP: Duration = Duration::from_secs(30);

#[derive(Debug)]
struct Opts {
    trials: usize,
    providers: Vec<String>,
    kinds: Vec<Kind>,
    timeout: Duration,
    json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Kill,
    Stop,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Kill => "kill",
            Kind::Stop => "stop",
        }
    }
    fn signal(self) -> i32 {
        match self {
            Kind::Kill => libc::SIGKILL,
            Kind::Stop => libc::SIGSTOP,
        }
    }
}

type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--peer") {
        return match (args.get(1), args.get(2)) {
            (Some(p), Some(addr)) => match peer(p, addr) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("loss_bench peer: {e}");
                    ExitCode::FAILURE
                }
            },
            _ => {
                eprintln!("loss_bench: --peer PROVIDER ADDRESS");
                ExitCode::from(2)
            }
        };
    }
    let o = match parse_opts(args) {
        Ok(Some(o)) => o,
        Ok(None) => {
            say!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("loss_bench: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loss_bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse_opts(args: Vec<String>) -> Result<Option<Opts>, String> {
    let mut o = Opts {
        trials: 50,
        providers: vec!["tcp;ofi_rxm".into(), "shm".into()],
        kinds: vec![Kind::Kill, Kind::Stop],
        timeout: Duration::from_secs(1),
        json: false,
    };
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let mut val = |n: &str| it.next().ok_or_else(|| format!("{n} needs a value"));
        match a.as_str() {
            "--trials" => {
                let v = val("--trials")?;
                o.trials = v
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or(format!("--trials {v}: a number of trials, at least 1"))?;
            }
            "-p" => o.providers = val("-p")?.split(',').map(str::to_string).collect(),
            "--kinds" => {
                o.kinds = val("--kinds")?
                    .split(',')
                    .map(|k| match k {
                        "kill" => Ok(Kind::Kill),
                        "stop" => Ok(Kind::Stop),
                        other => Err(format!("--kinds: `{other}` is neither kill nor stop")),
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--timeout-ms" => {
                let v = val("--timeout-ms")?;
                let ms: u64 = v
                    .parse()
                    .ok()
                    .filter(|&ms| ms >= 1000)
                    .ok_or(format!("--timeout-ms {v}: milliseconds, at least 1000"))?;
                o.timeout = Duration::from_millis(ms);
            }
            "--json" => o.json = true,
            "-h" | "--help" => return Ok(None),
            other => return Err(format!("unknown option `{other}`")),
        }
    }
    Ok(Some(o))
}

/// The fabric both sides negotiate for `provider`, as the ping-pong tools
/// would with `-p provider` (tcp on `lo`, shm with `--same-host`).
fn profile(provider: &str) -> AnyResult<Profile> {
    let mut args = vec!["-p".to_string(), provider.to_string()];
    if provider.starts_with("tcp") || provider.starts_with("udp") {
        args.extend(["-d".to_string(), "lo".to_string()]);
    } else {
        args.push("--same-host".to_string());
    }
    let o = match parse(Tool::PingPong, args)? {
        Parsed::Run(o) => o,
        Parsed::Help => return Err("no options".into()),
    };
    Ok(negotiate(&o.requirements(), &LadderConfig::load(None)?)?.profile)
}

/// The peer's role: connect, say hello, then wait to be signalled.
fn peer(provider: &str, addr: &str) -> AnyResult<()> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) only sets a flag of this process:
    // a benchmark that dies must not leave its (stopped) peers behind.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let mut ev = EventLoop::new(&profile(provider)?, LoopConfig::default())?;
    let ep = ev.open_endpoint()?;
    let peer = fabric_msg::connect(&mut ev, ep, addr, STEP)?;
    ev.send(&peer, Buffer::from_slice(b"hello"), SendOpts::default(), Token(1))?;
    let mut out = Vec::new();
    let t = Instant::now();
    // Serve until killed; give up after a minute on our own.
    while t.elapsed() < Duration::from_secs(60) {
        ev.poll(&mut out, Some(Duration::from_millis(100)))?;
        out.clear();
    }
    Ok(())
}

/// One trial's two times.
struct Trial {
    detect: Duration,
    first_op: Duration,
}

fn run(o: &Opts) -> AnyResult<()> {
    if !o.json {
        say!(
            "# loss_bench: {} trials each, peer_timeout {} ms; detection from kill(2) to PeerLost, ms; first send after it, µs",
            o.trials,
            o.timeout.as_millis()
        );
        say!(
            "{:<14} {:<5} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "provider",
            "kind",
            "trials",
            "det p50",
            "det p99",
            "det max",
            "op p50",
            "op p99",
            "op max"
        );
    }
    for provider in &o.providers {
        let profile = profile(provider)?;
        if profile.provider != *provider {
            return Err(format!("-p {provider}: negotiated {} instead", profile.provider).into());
        }
        let listener = Listener::bind(("127.0.0.1", 0))?;
        for &kind in &o.kinds {
            let mut detect = Vec::with_capacity(o.trials);
            let mut first_op = Vec::with_capacity(o.trials);
            for k in 0..o.trials {
                let t = trial(&profile, &listener, kind, o.timeout)
                    .map_err(|e| format!("{provider}, {}, trial {}: {e}", kind.name(), k + 1))?;
                detect.push(t.detect.as_nanos() as u64);
                first_op.push(t.first_op.as_nanos() as u64);
            }
            report(o, provider, kind, Tail::of(&detect), Tail::of(&first_op));
        }
    }
    Ok(())
}

fn report(o: &Opts, provider: &str, kind: Kind, detect: Option<Tail>, op: Option<Tail>) {
    let (Some(d), Some(f)) = (detect, op) else { return };
    if o.json {
        let mut dj = serde_json::json!({});
        d.add_json(&mut dj);
        let mut fj = serde_json::json!({});
        f.add_json(&mut fj);
        say!(
            "{}",
            serde_json::json!({"tool": "loss_bench", "provider": provider, "kind": kind.name(),
                "trials": d.count, "peer_timeout_ms": o.timeout.as_millis() as u64,
                "detect": dj, "first_op": fj})
        );
    } else {
        say!(
            "{:<14} {:<5} {:>7} {:>9.3} {:>9.3} {:>9.3} {:>9.2} {:>9.2} {:>9.2}",
            provider,
            kind.name(),
            d.count,
            d.p50 / 1e3,
            d.p99 / 1e3,
            d.max / 1e3,
            f.p50,
            f.p99,
            f.max
        );
    }
}

/// A peer process that is killed when dropped, whatever happened.
struct PeerProcess(Child);

impl PeerProcess {
    fn signal(&self, sig: i32) -> AnyResult<()> {
        // SAFETY: kill(2) on our own child, which has not been reaped
        // (it is waited for only in Drop), so the pid is still its.
        if unsafe { libc::kill(self.0.id() as i32, sig) } != 0 {
            return Err(format!(
                "kill({}, {sig}): {}",
                self.0.id(),
                std::io::Error::last_os_error()
            )
            .into());
        }
        Ok(())
    }
}

impl Drop for PeerProcess {
    fn drop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

fn trial(profile: &Profile, listener: &Listener, kind: Kind, timeout: Duration) -> AnyResult<Trial> {
    let config = LoopConfig {
        peer_timeout: Some(timeout),
        ..LoopConfig::default()
    };
    let mut ev = EventLoop::new(profile, config)?;
    let ep = ev.open_endpoint()?;
    let addr = listener.local_addr()?.to_string();
    let mut child = PeerProcess(
        Command::new(std::env::current_exe()?)
            .args(["--peer", &profile.provider, &addr])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()?,
    );
    let started = Instant::now();
    let peer = loop {
        let accepted =
            listener.poll_accept_with(&mut ev, ep, Some(Duration::from_millis(100)), |ev, e| {
                ev.recv(e, Buffer::new(64), RecvOpts::default(), Token(1))?;
                Ok(())
            })?;
        match accepted {
            Some(fabric_msg::Accepted::Peer(p)) => break p,
            Some(fabric_msg::Accepted::Refused(r)) => return Err(format!("peer refused: {r}").into()),
            None if started.elapsed() > STEP => return Err("the peer never connected".into()),
            None => {
                if let Some(s) = child.0.try_wait()? {
                    return Err(format!("the peer ended before connecting: {s}").into());
                }
            }
        }
    };
    let mut out = Vec::new();
    wait(&mut ev, &mut out, |c| c.token == Token(1))?
        .result
        .map_err(|e| format!("the peer's hello: {e}"))?;
    let t0 = Instant::now();
    child.signal(kind.signal())?;
    let notice = wait(&mut ev, &mut out, |c| peer.is_lost_in(c))?;
    let detect = t0.elapsed();
    if notice.result.is_ok() {
        return Err("a PeerLost notice without its error".into());
    }
    let t1 = Instant::now();
    let refused = ev.send(&peer, Buffer::from_slice(b"after"), SendOpts::default(), Token(2));
    let first_op = t1.elapsed();
    match refused {
        Err(fabric_msg::PostError {
            error: fabric_msg::Error::PeerLost { .. },
            ..
        }) => {}
        Err(e) => return Err(format!("the first send after the loss: {}, not PeerLost", e.error).into()),
        Ok(()) => return Err("the first send after the loss was accepted".into()),
    }

    Ok(Trial { detect, first_op })
}

/// Poll (1 ms at a time, as an application waiting would) until a
/// completion `want` takes; others are dropped.
fn wait(
    ev: &mut EventLoop,
    out: &mut Vec<Completion>,
    want: impl Fn(&Completion) -> bool,
) -> AnyResult<Completion> {
    let t = Instant::now();
    loop {
        if let Some(i) = out.iter().position(&want) {
            let c = out.swap_remove(i);
            out.clear();
            return Ok(c);
        }
        out.clear();
        if t.elapsed() > STEP {
            return Err(format!("nothing awaited within {} s", STEP.as_secs()).into());
        }
        ev.poll(out, Some(Duration::from_millis(1)))?;
    }
}
