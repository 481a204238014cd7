//! The PostgreSQL the tests use: `BERTH_TEST_POSTGRES_URL` and the CA of its certificate,
//! `BERTH_TEST_POSTGRES_CA` (`ci/postgres up` starts one; `ci/postgres env` prints the
//! variables), each test in a schema of its own. Under `ci/test`
//! (`BERTH_REQUIRE_POSTGRES=1`) a missing database fails; a plain `cargo test` skips and says so.

/// The server's URL, or `None` (saying that `test` is skipped) when none is configured and none
/// is required.
pub fn server_url(test: &str) -> Option<String> {
    match std::env::var("BERTH_TEST_POSTGRES_URL") {
        Ok(url) => Some(url),
        Err(_) if std::env::var("BERTH_REQUIRE_POSTGRES").is_ok_and(|v| v == "1") => {
            panic!("{test}: BERTH_TEST_POSTGRES_URL is not set, and this run requires PostgreSQL (ci/postgres up)")
        }
        Err(_) => {
            eprintln!("skipped {test}: no PostgreSQL (ci/postgres up; export $(ci/postgres env))");
            None
        }
    }
}

/// The CA file of the server's certificate (`ci/postgres up` makes one), or `None` (saying that
/// `test` is skipped) when none is configured and none is required.
pub fn server_ca(test: &str) -> Option<std::path::PathBuf> {
    match std::env::var("BERTH_TEST_POSTGRES_CA") {
        Ok(path) => Some(path.into()),
        Err(_) if std::env::var("BERTH_REQUIRE_POSTGRES").is_ok_and(|v| v == "1") => {
            panic!("{test}: BERTH_TEST_POSTGRES_CA is not set, and this run requires PostgreSQL (ci/postgres up)")
        }
        Err(_) => {
            eprintln!("skipped {test}: no PostgreSQL CA (ci/postgres up; export $(ci/postgres env))");
            None
        }
    }
}

/// The URL of a fresh, empty schema named after `test` (dropped first if a former run left it).
pub async fn fresh_schema(test: &str) -> Option<String> {
    let url = server_url(test)?;
    let schema = format!("test_{test}");
    let (admin, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    admin.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}")).await.unwrap();
    Some(in_schema(&url, &schema))
}

/// `url` with every table looked up in `schema`.
pub fn in_schema(url: &str, schema: &str) -> String {
    format!("{url}?options=-csearch_path%3D{schema}")
}
