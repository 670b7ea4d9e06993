pub fn run(_m: &std::path::Path) -> anyhow::Result<()> {
    anyhow::bail!("demo: not yet")
}
