//! Fires concurrent purchases at shop instances and prints a report; see
//! `lock_examples::loadgen`.

use lock_examples::args::Args;
use lock_examples::loadgen::{self, Endpoint, Load, Progress, Report, explain};

const USAGE: &str = "\
loadgen --target URL [--target URL ...] [options]

options:
  --target URL       a shop instance (repeat, or comma-separate); purchases go round-robin
  --requests N       purchases per endpoint (default 3000)
  --concurrency N    purchases in flight at once (default 64)
  --stock N          stock of the goods before each run (default 10)
  --goods ID         the goods to buy (default 1)
  --endpoint E       locked | unlocked | both (default both: then the report ends with what the
                     two runs show, explained with their numbers)
  --quiet            no progress lines
  --check            exit 1 unless the locked run oversold nothing and had no errors, and the
                     unlocked run (when run) oversold";

#[tokio::main]
async fn main() {
    let args = Args::from_env(
        USAGE,
        &[
            "target",
            "requests",
            "concurrency",
            "stock",
            "goods",
            "endpoint",
            "quiet",
            "check",
        ],
    );
    match run(&args).await {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("loadgen: {e}");
            std::process::exit(2);
        }
    }
}

async fn run(args: &Args) -> Result<bool, String> {
    let targets: Vec<String> = args
        .values("target")
        .into_iter()
        .map(str::to_owned)
        .collect();
    if targets.is_empty() {
        return Err(format!("give at least one --target\n\n{USAGE}"));
    }
    let endpoints = match args.value("endpoint").unwrap_or("both") {
        "locked" => vec![Endpoint::Locked],
        "unlocked" => vec![Endpoint::Unlocked],
        "both" => vec![Endpoint::Locked, Endpoint::Unlocked],
        other => {
            return Err(format!(
                "--endpoint: expected locked, unlocked or both, got {other:?}"
            ));
        }
    };
    let mut load = Load {
        targets,
        goods: args.parsed("goods", 1)?,
        stock: args.parsed("stock", 10)?,
        requests: args.parsed("requests", 3000)?,
        concurrency: args.parsed("concurrency", 64)?,
        endpoint: Endpoint::Locked,
        progress: if args.flag("quiet") {
            Progress::Quiet
        } else {
            Progress::Stderr
        },
    };
    let mut reports = Vec::new();
    for endpoint in endpoints {
        load.endpoint = endpoint;
        eprintln!(
            "firing {} purchases at the {} endpoint of {} instance(s), {} at a time, stock {}",
            load.requests,
            endpoint.name(),
            load.targets.len(),
            load.concurrency,
            load.stock
        );
        let report = loadgen::run(&load).await?;
        println!("\n{report}");
        reports.push(report);
    }
    if let [locked, unlocked] = &reports[..] {
        println!("\n{}", explain(locked, unlocked));
    }
    println!();
    for report in &reports {
        println!("{}", report.summary_line());
    }
    if !args.flag("check") {
        return Ok(true);
    }
    let problems = check(&reports);
    for problem in &problems {
        println!("CHECK FAILED: {problem}");
    }
    if problems.is_empty() {
        println!("CHECK OK: the lock prevented overselling");
    }
    Ok(problems.is_empty())
}

fn check(reports: &[Report]) -> Vec<String> {
    let mut problems = Vec::new();
    for r in reports {
        match r.endpoint {
            Endpoint::Locked => {
                if r.oversold() > 0 {
                    problems.push(format!("locked endpoint oversold {}", r.oversold()));
                }
                if r.errors > 0 {
                    problems.push(format!("locked endpoint had {} errors", r.errors));
                }
                if r.sold == 0 {
                    problems.push("locked endpoint sold nothing".into());
                }
            }
            Endpoint::Unlocked => {
                if r.oversold() == 0 {
                    problems.push("unlocked endpoint did not oversell: too little load?".into());
                }
            }
        }
    }
    problems
}
