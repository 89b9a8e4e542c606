//! Stub until the dialect module lands.
pub(crate) fn postgres_query(sql: &str) -> String {
    sql.to_owned()
}

pub(crate) fn postgres_schema(_: &[&str], _: usize) -> Result<Vec<String>, String> {
    Err("not yet".into())
}
