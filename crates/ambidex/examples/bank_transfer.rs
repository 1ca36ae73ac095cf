//! Bank transfers on a 3-node cluster in this process, every account kept on 3 nodes:
//! transfers run from every node at once, conflicts are retried, an overdraft is the
//! application's own error, and a read-only audit sees the total money unchanged.
//! `cargo run --release --example bank_transfer`
use ambidex::{Cluster, Config, Error, Schema};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut schema = Schema::new();
    let accounts = schema.table::<u64, i64>("accounts", 1_000)?;
    let cluster = Cluster::local(&Config::default(), &schema)?; // 3 nodes, 3 copies
    let t = accounts.clone();
    cluster.node(0)?.run(async move |tx| {
        for id in 0..100 {
            tx.insert(&t, id, &1_000)?;
        }
        Ok(())
    })?;

    let mut transfers = Vec::new();
    for i in 0..3_000u64 {
        let (from, to, amount) = (i % 100, (i * 7 + 1) % 100, 10 + (i as i64 % 90));
        let t = accounts.clone();
        transfers.push(cluster.node((i % 3) as u16)?.spawn(async move |tx| {
            let b = tx.get_many_for_update(&t, &[from, to]).await?;
            if b[0] < amount {
                return Err(Error::user(format!("account {from} is short")));
            }
            tx.put(&t, from, &(b[0] - amount))?;
            tx.put(&t, to, &(b[1] + amount))?;
            Ok(amount)
        })?);
    }
    let (mut moved, mut refused) = (0, 0);
    for t in transfers {
        match t.join() {
            Ok(amount) => moved += amount,
            Err(Error::User(_)) => refused += 1,
            Err(e) => return Err(e.into()),
        }
    }
    let t = accounts.clone();
    let total: i64 = cluster.node(1)?.read(async move |tx| {
        let ids: Vec<u64> = (0..100).collect();
        Ok(tx.get_many(&t, &ids).await?.into_iter().flatten().sum())
    })?;
    let report = cluster.shutdown()?;
    println!("moved {moved}, {refused} transfers refused; total {total}");
    println!(
        "{} commits, {} aborts retried",
        report.committed, report.aborted
    );
    assert_eq!(total, 100 * 1_000, "money was created or destroyed");
    Ok(())
}

#[test]
fn runs() {
    main().unwrap();
}
