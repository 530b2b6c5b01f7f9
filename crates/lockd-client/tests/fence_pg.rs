//! `fence::postgres` against a real PostgreSQL and a real lockd node.
//!
//! Needs `LOCKD_CHECK_PG` (a libpq connection string; `scripts/ci-postgres.sh` starts a server and
//! prints one) and `target/debug/lockd`. Without the first each test fails, naming it: a fencing
//! test that returned early would count as passed. `scripts/verify` leaves this binary out, and
//! lists it as skipped, when it cannot start PostgreSQL outside CI.

mod common;

use std::time::Duration;

use common::*;
use lockd_client::fence::postgres::{current, ensure_schema, fence, FenceDbError, Superseded};
use lockd_client::Client;
use tokio_postgres::NoTls;

async fn db() -> tokio_postgres::Client {
    let pg = match std::env::var("LOCKD_CHECK_PG") {
        Ok(s) if !s.is_empty() => s,
        _ => panic!(
            "LOCKD_CHECK_PG is not set, so this PostgreSQL test cannot run; start one with \
             export LOCKD_CHECK_PG=\"$(scripts/ci-postgres.sh)\" (or leave this binary out: \
             cargo nextest run -E 'not binary(fence_pg)')"
        ),
    };
    let (client, conn) = tokio_postgres::connect(&pg, NoTls).await.unwrap();
    tokio::spawn(conn);
    ensure_schema(&client).await.unwrap();
    client
}

/// A table of the application's own, with no fence column, named for this test run.
async fn app_table(db: &tokio_postgres::Client, tag: &str) -> String {
    let table = format!("fence_app_{tag}_{}", std::process::id());
    db.batch_execute(&format!(
        "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (id int PRIMARY KEY, v text); \
         INSERT INTO {table} VALUES (1, 'initial');"
    ))
    .await
    .unwrap();
    table
}

async fn value(db: &tokio_postgres::Client, table: &str) -> String {
    db.query_one(&format!("SELECT v FROM {table} WHERE id = 1"), &[])
        .await
        .unwrap()
        .get(0)
}

/// One fenced write of `v` with `token`: fence, update, commit; the fence's verdict.
async fn write(
    db: &mut tokio_postgres::Client,
    table: &str,
    resource: &str,
    token: u64,
    v: &str,
) -> Result<(), Superseded> {
    let tx = db.transaction().await.unwrap();
    if let Err(s) = fence(&tx, resource, token).await.unwrap() {
        tx.rollback().await.unwrap();
        return Err(s);
    }
    tx.execute(&format!("UPDATE {table} SET v = $1 WHERE id = 1"), &[&v])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_lease_ended_cannot_write_after_its_successor() {
    let mut db = db().await;
    let table = app_table(&db, "lease").await;
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(1, 1).await;
    let name = format!("fast/fence-pg-{}", std::process::id());

    // A takes the lock; then its session ends (as a paused process's would) and B takes it.
    let a = Client::connect_with(&c.grpc, options(Duration::from_secs(10)))
        .await
        .unwrap();
    let ga = a.acquire(name.as_str()).try_once().await.unwrap();
    let token_a = ga.token();
    write(&mut db, &table, &name, token_a, "A")
        .await
        .expect("the first holder fences");
    a.close().await.unwrap();
    let b = Client::connect_with(&c.grpc, options(Duration::from_secs(10)))
        .await
        .unwrap();
    let gb = b
        .acquire(name.as_str())
        .wait(Duration::from_secs(10))
        .await
        .unwrap();
    assert!(gb.token() > token_a, "{} after {token_a}", gb.token());
    write(&mut db, &table, &name, gb.token(), "B")
        .await
        .expect("the successor fences");

    // A wakes up still believing in its token: its write is refused, and changes nothing.
    let stale = write(&mut db, &table, &name, token_a, "A, stale").await;
    assert_eq!(stale, Err(Superseded { newer: gb.token() }));
    assert_eq!(value(&db, &table).await, "B");
    assert_eq!(current(&db, &name).await.unwrap(), Some(gb.token()));
    // The holder itself may write again under the same token.
    write(&mut db, &table, &name, gb.token(), "B2")
        .await
        .expect("the same token passes");
    assert_eq!(value(&db, &table).await, "B2");
    gb.release().await.unwrap();
    b.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_holder_waits_for_an_older_ones_commit_and_the_older_cannot_follow() {
    let mut older = db().await;
    let mut newer = db().await;
    let table = app_table(&older, "race").await;
    let resource = format!("race-{}", std::process::id());

    // The older holder fences and writes, then pauses before its commit.
    let tx = older.transaction().await.unwrap();
    fence(&tx, &resource, 5).await.unwrap().unwrap();
    tx.execute(&format!("UPDATE {table} SET v = 'older' WHERE id = 1"), &[])
        .await
        .unwrap();

    // The newer holder's fence waits on the older one's row lock...
    let (t2, r2) = (table.clone(), resource.clone());
    let newer_write = tokio::spawn(async move {
        let r = write(&mut newer, &t2, &r2, 6, "newer").await;
        (r, newer)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !newer_write.is_finished(),
        "the newer fence did not wait for the older transaction"
    );
    // ...until it commits; then the newer write goes on top of it.
    tx.commit().await.unwrap();
    let (r, newer) = tokio::time::timeout(Duration::from_secs(10), newer_write)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r, Ok(()));
    assert_eq!(value(&newer, &table).await, "newer");

    // The older holder, resumed, cannot write any more.
    let again = write(&mut older, &table, &resource, 5, "older again").await;
    assert_eq!(again, Err(Superseded { newer: 6 }));
    assert_eq!(value(&older, &table).await, "newer");
    // A token beyond PostgreSQL's bigint is refused before anything is sent.
    let tx = older.transaction().await.unwrap();
    assert!(matches!(
        fence(&tx, &resource, u64::MAX).await,
        Err(FenceDbError::TokenTooLarge(u64::MAX))
    ));
}
