//! A key-value counter service across 3 node processes over UDP on loopback: each process
//! is one node of the cluster (`Node::start`), holds its share of the counters (every
//! counter on all 3), and increments shared counters concurrently with the others;
//! at the end every process reads the same totals.
//!
//! Run without arguments, this program is the launcher: it picks 3 loopback ports,
//! writes the cluster's configuration file and starts itself 3 times as nodes 0, 1, 2
//! (`AMBIDEX_COUNTER_NODE`), then checks what they print.
//! `cargo run --release --example counter_service`
use ambidex::config::{ManagerKind, Transport};
use ambidex::{Config, Error, Node, Schema, Table};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const NODES: u16 = 3;
const COUNTERS: u64 = 8;
const INCREMENTS: u64 = 200;
/// Keys of the two barriers ("every node has started", "every node is done").
const STARTED: u64 = 1_000;
const DONE: u64 = 1_001;

/// Adds 1 to counter `key` (creating it at 1), returns its new value.
fn increment(node: &Node, t: &Table<u64, u64>, key: u64) -> Result<u64, Error> {
    loop {
        let t1 = t.clone();
        let r = node.run(async move |tx| {
            let v = tx.get_for_update(&t1, key).await? + 1;
            tx.put(&t1, key, &v).map(|()| v)
        });
        let t2 = t.clone();
        match r {
            Err(Error::NotFound { .. }) => {
                match node.run(async move |tx| tx.insert(&t2, key, &1)) {
                    Err(Error::AlreadyExists { .. }) => continue, // another node created it
                    other => return other.map(|()| 1),
                }
            }
            other => return other,
        }
    }
}

/// Waits until counter `key` reaches `n` (every node passed the barrier).
fn wait_for(node: &Node, t: &Table<u64, u64>, key: u64, n: u64) -> Result<(), Error> {
    let t0 = Instant::now();
    loop {
        let t1 = t.clone();
        if node
            .read(async move |tx| tx.get(&t1, key).await)?
            .unwrap_or(0)
            >= n
        {
            return Ok(());
        }
        if t0.elapsed() > Duration::from_secs(30) {
            return Err(Error::user(format!(
                "counter {key} stayed below {n} for 30 s"
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Node `id`: start, increment, agree on the totals, stop once every node is done.
fn node_main(id: u16, config: &str) -> Result<(), Box<dyn std::error::Error>> {
    let cfg = Config::read(std::path::Path::new(config), &Config::default())?;
    let mut schema = Schema::new();
    let counters = schema.table::<u64, u64>("counters", 2 * COUNTERS)?;
    let node = Node::start(&cfg, id, &schema)?;
    // Until every node is up, transactions that need one not yet started are retried.
    increment(&node, &counters, STARTED)?;
    wait_for(&node, &counters, STARTED, NODES as u64)?;
    for i in 0..INCREMENTS {
        increment(&node, &counters, i % COUNTERS)?;
    }
    increment(&node, &counters, DONE)?;
    wait_for(&node, &counters, DONE, NODES as u64)?;
    let (t, keys) = (counters.clone(), (0..COUNTERS).collect::<Vec<_>>());
    let totals = node.read(async move |tx| tx.get_many(&t, &keys).await)?;
    let sum: u64 = totals.iter().flatten().sum();
    println!("node {id} total {sum}");
    // The others may still be reading: keep serving them a moment.
    std::thread::sleep(Duration::from_secs(1));
    node.shutdown()?;
    Ok(())
}

/// The launcher: 3 node processes of this program, and their totals checked.
fn launch() -> Result<(), Box<dyn std::error::Error>> {
    let mut cfg = Config::default();
    cfg.cluster.transport = Transport::Udp;
    cfg.cluster.manager = ManagerKind::None;
    cfg.cluster.nodes = NODES;
    // A free loopback port per node (one thread each: the node listens on it), held
    // until all are chosen so that no two are the same.
    let held = (0..NODES)
        .map(|_| std::net::UdpSocket::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()?;
    for s in &held {
        cfg.cluster.udp_addrs.push(s.local_addr()?);
    }
    drop(held);
    let path = std::env::temp_dir().join(format!("ambidex-counters-{}.toml", std::process::id()));
    cfg.write(&path)?;
    // Under `cargo test` this binary is a test harness: run this example's test again.
    let args: &[&str] = if cfg!(test) {
        &["runs", "--exact", "--nocapture"]
    } else {
        &[]
    };
    let children = (0..NODES)
        .map(|n| {
            Command::new(std::env::current_exe()?)
                .args(args)
                .env("AMBIDEX_COUNTER_NODE", n.to_string())
                .env("AMBIDEX_COUNTER_CONFIG", &path)
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut totals = Vec::new();
    for (n, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let total = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("node {n} total ")));
        match (out.status.success(), total) {
            (true, Some(t)) => totals.push(t.trim().parse::<u64>()?),
            _ => return Err(format!("node {n} failed ({}): {text}", out.status).into()),
        }
    }
    let _ = std::fs::remove_file(&path);
    let want = NODES as u64 * INCREMENTS;
    println!("every node counted {totals:?}; {want} increments were made");
    if totals.iter().any(|&t| t != want) {
        return Err("the nodes disagree with the increments made".into());
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    match std::env::var("AMBIDEX_COUNTER_NODE") {
        Ok(id) => node_main(id.parse()?, &std::env::var("AMBIDEX_COUNTER_CONFIG")?),
        Err(_) => launch(),
    }
}

#[test]
fn runs() {
    main().unwrap();
}
