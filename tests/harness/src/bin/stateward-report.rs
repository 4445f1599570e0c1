//! Prints the run's figures and real-pods test durations as a table, and writes them as one
//! JSON document: `stateward-report <figures.jsonl> <report.json>` (scripts/test, at its end).

use anyhow::Context as _;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args_os().skip(1);
    let (Some(lines), Some(out)) = (args.next(), args.next()) else {
        anyhow::bail!("usage: stateward-report <figures.jsonl> <report.json>");
    };
    // No figures file: no test recorded one (e.g. a run of one offline test).
    let text = std::fs::read_to_string(&lines).unwrap_or_default();
    let (report, table) = stateward_testkit::report::summarize(&text);
    std::fs::write(&out, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", std::path::Path::new(&out).display()))?;
    print!("{table}");
    println!("(the report: {})", std::path::Path::new(&out).display());
    Ok(())
}
