//! Command-line options shared by `pingpong` and `bandwidth`, with
//! fabtests' letters where they mean the same thing.

use fabric_msg::discovery::negotiate::{Capability, EndpointChoice};
use fabric_msg::{Requirements, WaitMode};

/// Which tool is parsing: the options only one of them has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    /// `pingpong`: one message each way at a time.
    PingPong,
    /// `bandwidth`: a window of messages in flight, acknowledged per window.
    Bandwidth,
    /// `rma_pingpong`: RMA writes with immediate data, one each way at a time.
    RmaPingPong,
}

impl Tool {
    /// The program's name, as error messages start.
    pub fn name(self) -> &'static str {
        match self {
            Tool::PingPong => "pingpong",
            Tool::Bandwidth => "bandwidth",
            Tool::RmaPingPong => "rma_pingpong",
        }
    }

    /// Number sent in the plan, so a client of one tool cannot drive a
    /// server of the other.
    pub(crate) fn id(self) -> u64 {
        match self {
            Tool::PingPong => 1,
            Tool::Bandwidth => 2,
            Tool::RmaPingPong => 3,
        }
    }

    pub(crate) fn from_id(id: u64) -> Option<Tool> {
        [Tool::PingPong, Tool::Bandwidth]
            .into_iter()
            .find(|t| t.id() == id)
    }

    /// The usage text.
    pub fn usage(self) -> String {
        const MSG: &str = "  --msg           untagged messages (default tagged)\n";
        const PLAN: &str = "The client chooses sizes, iterations, window, --verify and --msg and tells
the server; both sides must use the same provider and endpoint type.";
        let (what, extra, last) = match self {
            Tool::PingPong => (
                "one-way latency: one message each way at a time",
                format!("  --borrowed      client sends from and receives into its own memory (unsafe API)\n{MSG}"),
                PLAN,
            ),
            Tool::Bandwidth => (
                "streaming bandwidth: a window of messages in flight, one ack per window",
                format!("  -w WINDOW       messages in flight, and receives posted (default 64)\n{MSG}"),
                PLAN,
            ),
            Tool::RmaPingPong => (
                "one-way latency of RMA writes with immediate data into the peer's registered memory",
                "  -o write|read   write: a ping-pong of writes with immediate data (default);
                  read: the client reads the server's memory, one read at a time
  --mr pool|each  client's source memory: a registered pool slot (default), or
                  registered and deregistered around every write
  --idle-ms N     with -o read, server: a busy target that polls only once
                  every N ms; reads then complete through its progress
                  thread (--progress-us) or wait for that poll\n"
                    .to_string(),
                "Sizes are 1 byte to 4 MiB. Give both sides the same -S, -I and -W, provider
and endpoint type.",
            ),
        };
        format!(
            "\
usage: {name} [options] [ADDRESS]
{what}. Without ADDRESS: server; with it: client.

  -p PROVIDER     provider, as fabtests means it: tcp admits its layered form
                  'tcp;ofi_rxm' for -e rdm; a layered name is exact
  -d DOMAIN       domain, e.g. lo, rxe0
  -e rdm|msg      endpoint type (default rdm; msg implies --msg)
  -c spin|fd      completion wait: spin on the CQ (default) or sleep on its fd
  --spin-us N     with -c fd: spin this many microseconds before sleeping
                  (default 50; 0 sleeps at once)
  --progress-us N a progress thread that drives the provider every N
                  microseconds while the loop does not poll (default 0: none)
  -S SIZES|all    message size in bytes (0 allowed) or a comma list, or all:
                  powers of two to 4 MiB (default all)
  -I ITERATIONS   measured messages per size (default 1000)
  -W WARMUP       warm-up messages per size, not measured (default 10)
{extra}  -B PORT         server: out-of-band port to listen on (default 9228; 0: any, printed)
  -P PORT         client: the server's out-of-band port (default 9228)
  --verify        check every received byte
  --loopback      server and client in this process over 127.0.0.1
  --same-host     peers share this host (allows shared memory)
  --json          JSON Lines: the fabric, then one object per size
  --stats         the loop's counters after the last size (EventLoop::stats)
  -h, --help      this text

{last}
",
            name = self.name()
        )
    }
}

/// Parsed options.
#[derive(Debug, Clone)]
pub struct Opts {
    /// The tool these are for.
    pub tool: Tool,
    /// `-p`.
    pub provider: Option<String>,
    /// `-d`.
    pub domain: Option<String>,
    /// `-e`.
    pub endpoint: EndpointChoice,
    /// `-c`.
    pub wait: WaitMode,
    /// `--spin-us`: spinning before a blocking wait, in microseconds.
    pub spin_us: u64,
    /// `-S`.
    pub sizes: Vec<usize>,
    /// `-I`.
    pub iters: usize,
    /// `-W`.
    pub warmup: usize,
    /// `-w` (bandwidth).
    pub window: usize,
    /// `-B`.
    pub bind_port: u16,
    /// `-P`.
    pub port: u16,
    /// Not `--msg`.
    pub tagged: bool,
    /// `--verify`.
    pub verify: bool,
    /// `--borrowed` (pingpong).
    pub borrowed: bool,
    /// `--mr each` (rma_pingpong): register the source memory per write.
    pub register_each: bool,
    /// `-o read` (rma_pingpong): RMA reads instead of writes.
    pub read: bool,
    /// `--progress-us`: the progress thread's period; 0: no thread.
    pub progress_us: u64,
    /// `--idle-ms` (rma_pingpong, server, `-o read`): poll only this often.
    pub idle_ms: u64,
    /// `--loopback`.
    pub loopback: bool,
    /// `--same-host`.
    pub same_host: bool,
    /// `--json`.
    pub json: bool,
    /// `--stats`: print the loop's counters after the last size.
    pub stats: bool,
    /// The server's address: client mode.
    pub address: Option<String>,
}

/// What parsing decided.
#[derive(Debug)]
pub enum Parsed {
    /// Run with these options.
    Run(Box<Opts>),
    /// `-h`: print the usage and succeed.
    Help,
}

/// Most sizes one run may list.
pub const MAX_SIZES: usize = 64;

/// Powers of two from 1 byte to 4 MiB.
pub fn all_sizes() -> Vec<usize> {
    (0..=22).map(|p| 1usize << p).collect()
}

/// Parse `args` (without the program name).
pub fn parse(tool: Tool, args: impl IntoIterator<Item = String>) -> Result<Parsed, String> {
    let mut o = Opts {
        tool,
        provider: None,
        domain: None,
        endpoint: EndpointChoice::Rdm,
        wait: WaitMode::Spin,
        spin_us: 50,
        sizes: all_sizes(),
        iters: 1000,
        warmup: 10,
        window: 64,
        bind_port: 9228,
        port: 9228,
        tagged: true,
        verify: false,
        borrowed: false,
        register_each: false,
        read: false,
        progress_us: 0,
        idle_ms: 0,
        loopback: false,
        same_host: false,
        json: false,
        stats: false,
        address: None,
    };
    let mut untagged = false;
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let mut val = |n: &str| it.next().ok_or_else(|| format!("{n} needs a value"));
        match a.as_str() {
            "-p" => o.provider = Some(val("-p")?),
            "-d" => o.domain = Some(val("-d")?),
            "-e" => {
                o.endpoint = match val("-e")?.as_str() {
                    "rdm" => EndpointChoice::Rdm,
                    "msg" => EndpointChoice::Msg,
                    other => return Err(format!("-e {other}: expected rdm or msg")),
                }
            }
            "-c" => {
                o.wait = match val("-c")?.as_str() {
                    "spin" => WaitMode::Spin,
                    "fd" => WaitMode::Block,
                    other => return Err(format!("-c {other}: expected spin or fd")),
                }
            }
            "--spin-us" => {
                let v = val("--spin-us")?;
                o.spin_us = v
                    .parse()
                    .map_err(|_| format!("--spin-us {v}: not a number of microseconds"))?;
            }
            "-S" => {
                let v = val("-S")?;
                o.sizes = if v == "all" {
                    all_sizes()
                } else {
                    v.split(',').map(|s| number("-S", s)).collect::<Result<_, _>>()?
                };
                if o.sizes.len() > MAX_SIZES {
                    return Err(format!("-S: at most {MAX_SIZES} sizes"));
                }
            }
            "-I" => {
                o.iters = number("-I", &val("-I")?)?;
                if !(1..=MAX_ITERS).contains(&o.iters) {
                    return Err(format!("-I {}: 1 to {MAX_ITERS} iterations", o.iters));
                }
            }
            "-W" => {
                o.warmup = number("-W", &val("-W")?)?;
                if o.warmup > MAX_ITERS {
                    return Err(format!("-W {}: at most {MAX_ITERS} warm-up messages", o.warmup));
                }
            }
            "-w" if tool == Tool::Bandwidth => {
                o.window = number("-w", &val("-w")?)?;
                if !(1..=MAX_WINDOW).contains(&o.window) {
                    return Err(format!(
                        "-w {}: the window is 1 to {MAX_WINDOW} messages",
                        o.window
                    ));
                }
            }
            "-B" => o.bind_port = port("-B", &val("-B")?)?,
            "-P" => o.port = port("-P", &val("-P")?)?,
            "--msg" if tool != Tool::RmaPingPong => untagged = true,
            "--mr" if tool == Tool::RmaPingPong => {
                o.register_each = match val("--mr")?.as_str() {
                    "pool" => false,
                    "each" => true,
                    other => return Err(format!("--mr {other}: expected pool or each")),
                }
            }
            "-o" if tool == Tool::RmaPingPong => {
                o.read = match val("-o")?.as_str() {
                    "write" => false,
                    "read" => true,
                    other => return Err(format!("-o {other}: expected write or read")),
                }
            }
            "--progress-us" => {
                let v = val("--progress-us")?;
                o.progress_us = v
                    .parse()
                    .map_err(|_| format!("--progress-us {v}: not a number of microseconds"))?;
            }
            "--idle-ms" if tool == Tool::RmaPingPong => {
                let v = val("--idle-ms")?;
                o.idle_ms = v
                    .parse()
                    .map_err(|_| format!("--idle-ms {v}: not a number of milliseconds"))?;
            }
            "--verify" => o.verify = true,
            "--borrowed" if tool == Tool::PingPong => o.borrowed = true,
            "--loopback" => o.loopback = true,
            "--same-host" => o.same_host = true,
            "--json" => o.json = true,
            "--stats" => o.stats = true,
            "-h" | "--help" => return Ok(Parsed::Help),
            s if s.starts_with('-') && s.len() > 1 => return Err(format!("unknown option `{s}`")),
            s => {
                if let Some(first) = &o.address {
                    return Err(format!("two addresses, `{first}` and `{s}`: give one"));
                }
                o.address = Some(s.to_string())
            }
        }
    }
    // Connected TCP endpoints have no tagged messages; fabtests' msg tools
    // are untagged too. RMA notices are untagged.
    o.tagged = !untagged && o.endpoint != EndpointChoice::Msg && tool != Tool::RmaPingPong;
    if tool == Tool::RmaPingPong {
        if o.sizes.contains(&0) {
            return Err("-S 0: an RMA transfer moves at least 1 byte".into());
        }
        if let Some(s) = o.sizes.iter().find(|&&s| s > MAX_RMA_SIZE) {
            return Err(format!(
                "-S {s}: at most {MAX_RMA_SIZE} bytes (4 MiB) per RMA transfer"
            ));
        }
    }
    if o.loopback && o.address.is_some() {
        return Err("--loopback runs both sides here: give no address".into());
    }
    Ok(Parsed::Run(Box::new(o)))
}

/// Largest `rma_pingpong` transfer: the size of each side's registered region.
pub const MAX_RMA_SIZE: usize = 4 << 20;

/// Largest `-w`: tags of messages in flight must stay distinct (16 bits).
pub const MAX_WINDOW: usize = 4096;

/// Most iterations (and warm-up messages) per size: counts and byte totals
/// derived from them stay far from overflowing.
pub const MAX_ITERS: usize = 1_000_000_000;

fn number(name: &str, v: &str) -> Result<usize, String> {
    v.parse::<usize>()
        .map_err(|_| format!("{name} {v}: not a non-negative number"))
}

fn port(name: &str, v: &str) -> Result<u16, String> {
    v.parse::<u16>()
        .map_err(|_| format!("{name} {v}: not a port (0 to 65535)"))
}

impl Opts {
    /// What negotiation is asked for.
    pub fn requirements(&self) -> Requirements {
        let mut caps = vec![Capability::Msg];
        if self.tagged {
            caps.push(Capability::Tagged);
        }
        if self.tool == Tool::RmaPingPong {
            caps.push(Capability::Rma);
        }
        Requirements {
            caps,
            endpoint: self.endpoint,
            provider: self.provider.clone(),
            provider_layered: true,
            domain: self.domain.clone(),
            same_host: self.same_host || self.loopback,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(tool: Tool, args: &[&str]) -> Result<Opts, String> {
        match parse(tool, args.iter().map(|s| s.to_string()))? {
            Parsed::Run(o) => Ok(*o),
            Parsed::Help => Err("help".into()),
        }
    }

    #[test]
    fn fabtests_letters() {
        let o = run(
            Tool::Bandwidth,
            &[
                "-p",
                "tcp;ofi_rxm",
                "-d",
                "lo",
                "-S",
                "0",
                "-I",
                "5",
                "-W",
                "0",
                "-w",
                "8",
                "-c",
                "fd",
                "-P",
                "7",
                "h",
            ],
        )
        .unwrap();
        assert_eq!(o.provider.as_deref(), Some("tcp;ofi_rxm"));
        assert_eq!(
            (o.sizes.clone(), o.iters, o.warmup, o.window, o.port),
            (vec![0], 5, 0, 8, 7)
        );
        assert_eq!(o.wait, WaitMode::Block);
        assert_eq!(o.address.as_deref(), Some("h"));
        assert!(o.tagged);
        let o = run(Tool::PingPong, &["-e", "msg", "-B", "0"]).unwrap();
        assert!(!o.tagged, "msg endpoints are untagged");
        assert_eq!(o.bind_port, 0);
        assert_eq!(all_sizes().last(), Some(&(4 << 20)));
        let o = run(Tool::PingPong, &["-S", "0,64,1048576"]).unwrap();
        assert_eq!(o.sizes, [0, 64, 1 << 20]);
    }

    #[test]
    fn bad_arguments_say_what_is_wrong() {
        let err = |tool, a: &[&str]| run(tool, a).unwrap_err();
        assert!(err(Tool::PingPong, &["-S", "-1"]).contains("-S -1: not a non-negative number"));
        assert!(err(Tool::PingPong, &["-S", "8,x"]).contains("-S x: not"));
        assert!(err(Tool::PingPong, &["-I", "0"]).contains("1 to 1000000000 iterations"));
        assert!(err(Tool::PingPong, &["-c", "sread"]).contains("expected spin or fd"));
        assert!(err(Tool::PingPong, &["-P", "70000"]).contains("not a port"));
        assert!(err(Tool::PingPong, &["-w", "8"]).contains("unknown option `-w`"));
        assert!(err(Tool::Bandwidth, &["--borrowed"]).contains("unknown option"));
        assert!(err(Tool::Bandwidth, &["-w", "0"]).contains("1 to 4096"));
        assert!(err(Tool::PingPong, &["-p"]).contains("-p needs a value"));
        assert!(err(Tool::PingPong, &["--loopback", "127.0.0.1"]).contains("no address"));
        assert_eq!(err(Tool::PingPong, &["-h"]), "help");
    }

    #[test]
    fn rma_pingpong_takes_the_same_letters_and_its_own_limits() {
        let o = run(
            Tool::RmaPingPong,
            &["-S", "1,4096", "--mr", "each", "-P", "7000", "h"],
        )
        .unwrap();
        assert_eq!(
            (o.sizes, o.register_each, o.port, o.tagged),
            (vec![1, 4096], true, 7000, false)
        );
        assert!(run(Tool::RmaPingPong, &["-S", "0"])
            .unwrap_err()
            .contains("at least 1 byte"));
        assert!(run(Tool::RmaPingPong, &["-S", "4194305"])
            .unwrap_err()
            .contains("at most"));
        assert!(run(Tool::RmaPingPong, &["-B", "70000"])
            .unwrap_err()
            .contains("not a port"));
        assert!(run(Tool::RmaPingPong, &["--msg"])
            .unwrap_err()
            .contains("unknown option"));
        assert!(run(Tool::PingPong, &["--mr", "each"])
            .unwrap_err()
            .contains("unknown option"));
    }
}
