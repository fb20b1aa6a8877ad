//! `node_pingpong`: ping-pong and message rate between two processes on
//! this node over fabric-msg's own same-node transport
//! (`fabric_msg::transport::node`), no libfabric provider in between.
//!
//! ```text
//! node_pingpong [-S SIZES] [-I ITERS] [-w WARMUP] [--rate WINDOW] [--pin] [--copy-from BYTES|never] [--json]
//! ```
//!
//! The process starts its peer (itself, with `--peer`), hands it its
//! segment's name on a pipe and reads the peer's back; both then spin on
//! their `NodeLoop`. Output columns are `pingpong`'s (`usec/xfer` is
//! one-way). `-S` takes sizes separated by commas (default
//! 8,64,4096,65536,1048576). Messages up to one frame (16 KiB) are
//! injected (no send completion, as `fi_inject`); larger ones are sent and
//! stream through the ring. `--rate W`: streams of W messages each
//! answered by one, as `bandwidth -w W`, at the first size of `-S`; the
//! rate is in `xfers/usec` (million messages a second). `--pin`: this
//! process on CPU 0, the peer on CPU 1. `--copy-from`: the size from which
//! the receiver reads a message from the sender's memory in one copy
//! (`NodeConfig::single_copy_from`; `never`: always through the ring).
//! `--peer-dies-after N` (for tests): the peer kills itself with
//! `SIGKILL` after N messages, and this side must say so, not hang.

use fabric_msg::transport::event_loop::Token;
use fabric_msg::transport::node::{NodeCompletion, NodeConfig, NodeLoop, SegmentName};
use fabric_msg::Buffer;
use fabric_msg_examples::output::{self, Row};
use fabric_msg_examples::stats::IterTimes;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

#[derive(Debug, Clone)]
struct Args {
    sizes: Vec<usize>,
    iters: usize,
    warmup: usize,
    rate: Option<usize>,
    pin: bool,
    json: bool,
    peer: bool,
    cfg: NodeConfig,
    /// Testing: the peer kills itself (SIGKILL) after this many messages.
    dies_after: Option<usize>,
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        sizes: vec![8, 64, 4096, 65536, 1 << 20],
        iters: 10_000,
        warmup: 1000,
        rate: None,
        pin: false,
        json: false,
        peer: false,
        cfg: NodeConfig::default(),
        dies_after: None,
    };
    let num = |v: Option<String>, what: &str| -> Result<usize, String> {
        v.ok_or(format!("{what} needs a value"))?
            .parse()
            .map_err(|e| format!("{what}: {e}"))
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "-S" => {
                let v = it.next().ok_or("-S needs sizes")?;
                a.sizes = v
                    .split(',')
                    .map(|s| s.parse().map_err(|e| format!("-S {s}: {e}")))
                    .collect::<Result<_, _>>()?;
            }
            "-I" => a.iters = num(it.next(), "-I")?.max(1),
            "-w" => a.warmup = num(it.next(), "-w")?,
            "--rate" => a.rate = Some(num(it.next(), "--rate")?.clamp(1, 4096)),
            "--pin" => a.pin = true,
            "--peer-dies-after" => a.dies_after = Some(num(it.next(), "--peer-dies-after")?),
            "--copy-from" => {
                let v = it.next().ok_or("--copy-from needs a size or `never`")?;
                a.cfg.single_copy_from = if v == "never" {
                    usize::MAX
                } else {
                    v.parse().map_err(|e| format!("--copy-from {v}: {e}"))?
                };
            }
            "--json" => a.json = true,
            "--peer" => a.peer = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    let a = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("node_pingpong: {e}");
            }
            eprintln!("usage: node_pingpong [-S SIZES] [-I ITERS] [-w WARMUP] [--rate WINDOW] [--pin] [--copy-from BYTES|never] [--json]");
            return ExitCode::from(2);
        }
    };
    match run(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("node_pingpong{}: {e}", if a.peer { " (peer)" } else { "" });
            ExitCode::FAILURE
        }
    }
}

fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET writes inside it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `cpu` < CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: the set is a valid cpu_set_t of the size given.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) } != 0 {
        eprintln!(
            "node_pingpong: could not pin to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        );
    }
}

fn encode(n: &SegmentName) -> String {
    format!("{} {} {} {}\n", n.pid, n.fd, n.len, n.cookie)
}

fn decode(line: &str) -> AnyResult<SegmentName> {
    let v: Vec<&str> = line.split_whitespace().collect();
    let [pid, fd, len, cookie] = v[..] else {
        return Err(format!("the peer's segment name {line:?} is not `pid fd len cookie`").into());
    };
    Ok(SegmentName {
        pid: pid.parse()?,
        fd: fd.parse()?,
        len: len.parse()?,
        cookie: cookie.parse()?,
    })
}

fn run(a: &Args) -> AnyResult<()> {
    let me = usize::from(a.peer);
    if a.pin {
        pin(me);
    }
    let mut l = NodeLoop::create(me, 2, a.cfg)?;
    l.connect(me, &l.name())?;
    if a.peer {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line)?;
        l.connect(0, &decode(&line)?)?;
        let mut out = std::io::stdout().lock();
        out.write_all(encode(&l.name()).as_bytes())?;
        out.flush()?;
        drop(out);
        return serve(&mut l, a);
    }
    let mut child = Command::new(std::env::current_exe()?)
        .args(std::env::args().skip(1))
        .arg("--peer")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .ok_or("no pipe to the peer")?
        .write_all(encode(&l.name()).as_bytes())?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().ok_or("no pipe from the peer")?).read_line(&mut line)?;
    l.connect(1, &decode(&line)?)?;
    let result = ping(&mut l, a);
    if result.is_err() {
        child.kill().ok();
    }
    let status = child.wait()?;
    result?;
    if !status.success() {
        return Err(format!("the peer ended with {status}").into());
    }
    Ok(())
}

/// Poll until `n` completions are in `out` (cleared first); fail when
/// the peer's process is gone (asked every 2^16 empty polls, about a
/// millisecond), or after 10 s without a completion (it hangs).
#[inline]
fn wait(l: &mut NodeLoop, out: &mut Vec<NodeCompletion>, n: usize) -> AnyResult<()> {
    out.clear();
    let mut spins = 0u32;
    let mut since = None::<Instant>;
    while out.len() < n {
        if l.poll(out) == 0 {
            spins = spins.wrapping_add(1);
            if spins % (1 << 16) == 0 && l.check_peers() > 0 {
                l.poll(out);
                break;
            }
            if spins % (1 << 20) == 0 {
                let t = *since.get_or_insert_with(Instant::now);
                if t.elapsed() > Duration::from_secs(10) {
                    return Err(format!("no completion for 10 s ({:?} pending)", l.pending()).into());
                }
            }
        } else {
            since = None;
        }
    }
    for c in out.iter() {
        if let Err(e) = &c.result {
            return Err(e.to_string().into());
        }
    }
    if out.len() < n {
        return Err("the peer is gone, with no completion".into());
    }
    Ok(())
}

/// Send `buf` to `peer`: injected when it fits one frame (no completion
/// to wait for), else sent; how many completions that adds.
#[inline]
fn put(
    l: &mut NodeLoop,
    out: &mut Vec<NodeCompletion>,
    peer: usize,
    buf: &mut Option<Buffer>,
) -> AnyResult<usize> {
    let b = buf.take().ok_or("no buffer")?;
    if b.len() <= NodeConfig::default().max_frame {
        while !l.inject(peer, 1, b.as_slice())? {
            l.poll(out);
        }
        *buf = Some(b);
        Ok(0)
    } else {
        l.send(peer, 1, b, Token(1))?;
        Ok(1)
    }
}

fn take_back(out: &mut Vec<NodeCompletion>, tx: &mut Option<Buffer>, rx: &mut Option<Buffer>) {
    for c in out.drain(..) {
        match c.token {
            Token(1) => *tx = Some(c.buffer),
            _ => *rx = Some(c.buffer),
        }
    }
}

fn buffers(size: usize, fill: u8) -> (Option<Buffer>, Option<Buffer>) {
    let mut tx = Buffer::new(size.max(1));
    tx.as_mut_slice().fill(fill);
    tx.set_len(size);
    (Some(tx), Some(Buffer::new(size.max(1))))
}

fn ping(l: &mut NodeLoop, a: &Args) -> AnyResult<()> {
    let mut out = Vec::with_capacity(8);
    if let Some(w) = a.rate {
        return rate(l, a, w, &mut out);
    }
    for &size in &a.sizes {
        let (mut tx, mut rx) = buffers(size, 1);
        let mut times = IterTimes::new(a.iters);
        let mut started = Instant::now();
        for i in 0..a.warmup + a.iters {
            if i == a.warmup {
                started = Instant::now();
                times.start(started);
            }
            l.recv(Some(1), 1, 0, rx.take().ok_or("no buffer")?, Token(2))?;
            let n = put(l, &mut out, 1, &mut tx)?;
            wait(l, &mut out, 1 + n)?;
            take_back(&mut out, &mut tx, &mut rx);
            if rx.as_ref().map(Buffer::len) != Some(size) {
                return Err(
                    format!("a reply of {:?} bytes, not {size}", rx.as_ref().map(Buffer::len)).into(),
                );
            }
            if i >= a.warmup {
                times.lap(2);
            }
        }
        output::report_row(
            a.json,
            &Row {
                bytes: size,
                sent: a.iters,
                acked: a.iters,
                elapsed: times.elapsed_since(started),
                xfers_per_iter: 2,
                tail: times.tail(),
            },
        );
    }
    Ok(())
}

fn serve(l: &mut NodeLoop, a: &Args) -> AnyResult<()> {
    let mut out = Vec::with_capacity(8);
    if let Some(w) = a.rate {
        return absorb(l, a, w, &mut out);
    }
    let mut count = 0;
    for &size in &a.sizes {
        let (mut tx, mut rx) = buffers(size, 2);
        for _ in 0..a.warmup + a.iters {
            count += 1;
            if a.dies_after == Some(count) {
                // SAFETY: signals this process; nothing after it runs.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            }
            l.recv(Some(0), 1, 0, rx.take().ok_or("no buffer")?, Token(2))?;
            wait(l, &mut out, 1)?;
            take_back(&mut out, &mut tx, &mut rx);
            if put(l, &mut out, 0, &mut tx)? == 1 {
                wait(l, &mut out, 1)?;
                take_back(&mut out, &mut tx, &mut rx);
            }
        }
    }
    Ok(())
}

/// Streaming: rounds of `w` messages of the first `-S` size, each round
/// answered by one 8-byte message; sent from `w` buffers (injected when
/// they fit a frame).
fn rate(l: &mut NodeLoop, a: &Args, w: usize, out: &mut Vec<NodeCompletion>) -> AnyResult<()> {
    let size = a.sizes.first().copied().unwrap_or(8);
    let inject = size <= NodeConfig::default().max_frame;
    let mut bufs: Vec<Option<Buffer>> = (0..w).map(|_| buffers(size, 1).0).collect();
    let mut ack = Some(Buffer::new(8));
    let rounds = (a.iters / w).max(1);
    let warm = (a.warmup / w).max(1);
    let mut started = Instant::now();
    for r in 0..warm + rounds {
        if r == warm {
            started = Instant::now();
        }
        l.recv(Some(1), 2, 0, ack.take().ok_or("no buffer")?, Token(u64::MAX))?;
        for (i, slot) in bufs.iter_mut().enumerate() {
            let b = slot.take().ok_or("no buffer")?;
            if inject {
                while !l.inject(1, 1, b.as_slice())? {
                    l.poll(out);
                }
                *slot = Some(b);
            } else {
                l.send(1, 1, b, Token(10 + i as u64))?;
            }
        }
        wait(l, out, if inject { 1 } else { w + 1 })?;
        for c in out.drain(..) {
            match c.token.0 {
                u64::MAX => ack = Some(c.buffer),
                t => bufs[(t - 10) as usize] = Some(c.buffer),
            }
        }
    }
    output::report_row(
        a.json,
        &Row {
            bytes: size,
            sent: rounds * w,
            acked: rounds * w,
            elapsed: started.elapsed(),
            xfers_per_iter: 1,
            tail: None,
        },
    );
    Ok(())
}

fn absorb(l: &mut NodeLoop, a: &Args, w: usize, out: &mut Vec<NodeCompletion>) -> AnyResult<()> {
    let size = a.sizes.first().copied().unwrap_or(8);
    let rounds = (a.iters / w).max(1) + (a.warmup / w).max(1);
    let mut bufs: Vec<Option<Buffer>> = (0..w).map(|_| Some(Buffer::new(size.max(1)))).collect();
    for _ in 0..rounds {
        for (i, b) in bufs.iter_mut().enumerate() {
            l.recv(Some(0), 1, 0, b.take().ok_or("no buffer")?, Token(10 + i as u64))?;
        }
        wait(l, out, w)?;
        for c in out.drain(..) {
            if c.buffer.len() != size {
                return Err(format!("a message of {} bytes, not {size}", c.buffer.len()).into());
            }
            bufs[(c.token.0 - 10) as usize] = Some(c.buffer);
        }
        while !l.inject(0, 2, &[0u8; 8])? {
            l.poll(out);
        }
    }
    Ok(())
}
