//! `fabric_info`: what will my application get on this host, and why?
//!
//! Like libfabric's `fi_info`, but it shows fabric-msg's decision: every
//! candidate libfabric lists with its classification, the walk down the
//! provider ladder with the reason each rung was passed over, and the
//! negotiated profile.

use fabric_msg::discovery::negotiate::{Capability, EndpointChoice, Reason};
use fabric_msg::{negotiate, AtomicPolicy, Error, LadderConfig, Profile, Requirements};
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "\
usage: fabric_info [options]

  -p, --provider NAME   only this provider (e.g. tcp, 'verbs;ofi_rxm'); FI_PROVIDER also applies
  -d, --domain NAME     only this domain (e.g. mlx5_0, rxe0, lo)
  -e, --ep rdm|msg|any  endpoint type the application accepts (default any)
  -c, --caps LIST       required capabilities: msg,tagged,rma,atomic,directed (default tagged,msg)
      --atomics auto|native|emulated
                        how atomics are carried (default auto: native where the
                        provider has every u64 operation, emulated by fabric-msg
                        otherwise; native makes `-c atomic` choose only providers
                        with native atomics)
      --same-host       all peers are on this host (allows shared memory)
      --providers FILE  ladder file instead of FABRIC_MSG_PROVIDERS or the built-in one
      --json            print one JSON object instead of text
  -h, --help            this text
";

struct Args {
    req: Requirements,
    providers: Option<PathBuf>,
    json: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut req = Requirements::default();
    let mut providers = None;
    let mut json = false;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "-p" | "--provider" => req.provider = Some(value(&a)?),
            "-d" | "--domain" => req.domain = Some(value(&a)?),
            "-e" | "--ep" => {
                req.endpoint = match value(&a)?.as_str() {
                    "rdm" => EndpointChoice::Rdm,
                    "msg" => EndpointChoice::Msg,
                    "any" => EndpointChoice::Any,
                    other => return Err(format!("-e {other}: expected rdm, msg or any")),
                }
            }
            "-c" | "--caps" => {
                req.caps = value(&a)?
                    .split(',')
                    .map(|c| match c.trim() {
                        "msg" => Ok(Capability::Msg),
                        "tagged" => Ok(Capability::Tagged),
                        "rma" => Ok(Capability::Rma),
                        "atomic" | "atomics" => Ok(Capability::Atomic),
                        "directed" => Ok(Capability::DirectedRecv),
                        other => Err(format!(
                            "--caps: unknown capability `{other}` (msg, tagged, rma, atomic)"
                        )),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--atomics" => {
                req.atomics = match value(&a)?.as_str() {
                    "auto" => AtomicPolicy::Auto,
                    "native" => AtomicPolicy::Native,
                    "emulated" => AtomicPolicy::Emulated,
                    other => return Err(format!("--atomics {other}: expected auto, native or emulated")),
                }
            }
            "--same-host" => req.same_host = true,
            "--providers" => providers = Some(PathBuf::from(value(&a)?)),
            "--json" => json = true,
            "-h" | "--help" => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(Args { req, providers, json })
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("fabric_info: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let ladder = match LadderConfig::load(args.providers.as_deref()) {
        Ok(l) => l,
        Err(e) => return fail(&e, args.json),
    };
    match negotiate(&args.req, &ladder) {
        Ok(n) if args.json => {
            let v = serde_json::json!({ "requirements": args.req, "negotiation": n,
                "atomics": carriers_json(&n.profile) });
            fabric_msg_examples::say!(
                "{}",
                serde_json::to_string_pretty(&v).expect("plain data serialises")
            );
            ExitCode::SUCCESS
        }
        Ok(n) => {
            print_text(&n);
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e, args.json),
    }
}

fn fail(e: &Error, json: bool) -> ExitCode {
    if json {
        let reasons = match e {
            Error::NoFabric { reasons, .. } => serde_json::to_value(reasons).unwrap_or_default(),
            _ => serde_json::Value::Null,
        };
        fabric_msg_examples::say!(
            "{}",
            serde_json::json!({ "error": e.to_string(), "reasons": reasons })
        );
    } else if let Error::NoFabric { wanted, reasons } = e {
        eprintln!("fabric_info: no usable fabric for {wanted}");
        for r in reasons {
            eprintln!("  {r}");
        }
        eprintln!("Change the requirements (-c, -e, -d), FI_PROVIDER, or the ladder (--providers).");
    } else {
        eprintln!("fabric_info: {e}");
    }
    ExitCode::FAILURE
}

fn print_text(n: &fabric_msg::Negotiation) {
    let p = &n.profile;
    let (maj, min) = p.libfabric_version;
    fabric_msg_examples::say!("libfabric {maj}.{min}; ladder: {}", n.ladder);
    for e in &n.environment {
        fabric_msg_examples::say!("environment: {}={}  ({})", e.name, e.value, e.origin);
    }

    fabric_msg_examples::say!("\ncandidates libfabric lists:");
    fabric_msg_examples::say!(
        "  {:<16} {:<6} {:<14} {:<14} evidence",
        "provider",
        "ep",
        "domain",
        "kind"
    );
    let mut seen = Vec::new();
    for c in &n.candidates {
        let key = (
            c.info.provider.clone(),
            c.info.endpoint_type,
            c.info.domain.clone(),
        );
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        fabric_msg_examples::say!(
            "  {:<16} {:<6} {:<14} {:<14} {}",
            c.info.provider,
            c.info.endpoint_type.to_string(),
            c.info.domain,
            c.class.kind.to_string(),
            c.class.evidence
        );
    }

    fabric_msg_examples::say!("\nladder:");
    fabric_msg_examples::say!("  chosen  {} on {}", p.rung, p.domain);
    let mut not_tried = Vec::new();
    for r in &n.rejections {
        if r.reason == Reason::NotNeeded {
            not_tried.push(format!("{} on {}", r.rung, r.domain.as_deref().unwrap_or("?")));
        } else {
            fabric_msg_examples::say!("  passed  {r}");
        }
    }
    if !not_tried.is_empty() {
        fabric_msg_examples::say!(
            "  usable but not tried, as a preferred rung was chosen: {}",
            not_tried.join("; ")
        );
    }

    fabric_msg_examples::say!("\nprofile:");
    let row = |k: &str, v: String| fabric_msg_examples::say!("  {k:<18} {v}");
    row("provider", p.provider.clone());
    row("fabric kind", format!("{} ({})", p.fabric_kind, p.classification));
    row("fabric / domain", format!("{} / {}", p.fabric, p.domain));
    row("endpoint", format!("{} {}", p.endpoint_type, p.protocol));
    row("caps requested", p.caps_requested.join(" "));
    row("caps granted", p.caps_granted.join(" "));
    row("mode", p.mode.join(" "));
    row(
        "mr_mode",
        format!("[{}] key {} bytes", p.mr_mode.join(" "), p.mr_key_size),
    );
    row("remote access", p.remote_protection.to_string());
    row("inject_size", p.inject_size.to_string());
    row("max_msg_size", p.max_msg_size.to_string());
    row("cq_data_size", p.cq_data_size.to_string());
    row("tag bits", p.tag_bits.to_string());
    if let Some(why) = &p.tag_mask_defect {
        row("tag masks", format!("NOT RELIABLE: {why}"));
    }
    row("iov / rma_iov", format!("{} / {}", p.iov_limit, p.rma_iov_limit));
    let atomics: Vec<String> = p
        .atomics
        .iter()
        .map(|a| format!("{}({})", a.op, a.form))
        .collect();
    let atomics_asked = p.caps_requested.iter().any(|c| c == "FI_ATOMIC");
    row(
        "u64 atomics",
        if atomics_asked {
            format!("provider validates [{}]", atomics.join(" "))
        } else {
            "not probed (ask with -c ...,atomic)".into()
        },
    );
    let carried: Vec<String> = p
        .atomic_carriers()
        .iter()
        .map(|(op, c)| format!("{}={c}", fabric_msg_examples::output::atomic_op_name(*op)))
        .collect();
    row(
        "atomics carried",
        if carried.is_empty() {
            "none (no native atomics probed, and no tagged RDM endpoints to emulate them)".into()
        } else {
            format!("{} (policy {:?})", carried.join(" "), p.atomic_policy)
        },
    );
    row(
        "progress",
        format!("data {:?}, control {:?}", p.data_progress, p.control_progress),
    );
    row(
        "idle targets",
        if fabric_msg::ProgressThread::needed(p) {
            "peers' RMA to this side completes only while it polls, or with a progress thread \
             (LoopConfig::progress_thread: WhereNeeded or On)"
        } else {
            "peers' RMA completes without this side polling (no progress thread needed)"
        }
        .into(),
    );
    row("wait fd", p.wait_fd.to_string());
    row("threading", format!("{:?}", p.threading));
    row(
        "domain limits",
        format!(
            "cq_cnt {} ep_cnt {} mr_cnt {} tx {} rx {} max_cqe {}",
            p.limits.cq_cnt,
            p.limits.ep_cnt,
            p.limits.mr_cnt,
            p.limits.tx_size,
            p.limits.rx_size,
            p.limits.max_cqe.map_or("unknown".into(), |m| m.to_string())
        ),
    );
    row(
        "queues",
        format!(
            "tx {} rx {} cq {} av {}",
            p.queues.tx, p.queues.rx, p.queues.cq, p.queues.av
        ),
    );
}

/// How each atomic operation is carried: `{"policy": .., "carriers": {op: "native"|"emulated"}}`;
/// operations not carried are absent.
fn carriers_json(p: &Profile) -> serde_json::Value {
    let carriers: serde_json::Map<String, serde_json::Value> = p
        .atomic_carriers()
        .iter()
        .map(|(op, c)| {
            (
                fabric_msg_examples::output::atomic_op_name(*op).to_string(),
                c.to_string().into(),
            )
        })
        .collect();
    serde_json::json!({ "policy": p.atomic_policy, "carriers": carriers })
}
