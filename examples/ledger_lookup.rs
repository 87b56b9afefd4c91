//! Benchmark (not a test): how long discovery's ledger lookups take on a node with N used block
//! volumes, one lookup per volume over a ledger of N entries (what every pass does), through
//! the index and by a full scan. Prints a JSON line and a table; never fails on timing.
//! `cargo run --release --example ledger_lookup -- 1000`

use std::time::Instant;

use local_static_provisioner::core::identity::used_mark::{
    LedgerIndex, UsedMark, UsedRead, ledger_lookup, ledger_lookup_indexed,
};

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let identity = |i: usize| format!("v2;blk;disk=wwid:disk{i};size=1000000;dev=8:{i}");
    let entries: Vec<UsedMark> = (0..n)
        .map(|i| UsedMark {
            pv: format!("local-pv-{i}"),
            node: "node".into(),
            path: format!("/mnt/disks/v{i}"),
            identity: identity(i),
            at: "2026-11-24T00:00:00Z".into(),
            uid: Some(format!("uid-{i}")),
            root: None,
            claimed: true,
            wiped_filesystems: Vec::new(),
        })
        .collect();
    let index = LedgerIndex::build(&entries);
    let time = |lookup: &dyn Fn(&str) -> UsedRead| {
        let start = Instant::now();
        let found = (0..n).filter(|i| matches!(lookup(&identity(*i)), UsedRead::Marked(_))).count();
        assert_eq!(found, n, "every volume is found in the ledger");
        start.elapsed().as_secs_f64()
    };
    let indexed = time(&|id| ledger_lookup_indexed(&entries, &index, &[], id, None));
    let scanned = time(&|id| ledger_lookup(&entries, &[], id, None));
    println!(
        "{{\"figure\":\"ledger_lookup\",\"entries\":{n},\"lookups\":{n},\"indexed_s\":{indexed:.6},\"full_scan_s\":{scanned:.6}}}"
    );
    println!("{:<14} {:>8} {:>8} {:>12} {:>12}", "figure", "entries", "lookups", "indexed_s", "full_scan_s");
    println!("{:<14} {:>8} {:>8} {:>12.6} {:>12.6}", "ledger_lookup", n, n, indexed, scanned);
}
