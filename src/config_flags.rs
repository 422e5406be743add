//! Commands configured by their flags' names: `[router]`, `[eval]` and `[audit]` in the TOML
//! file hold values for the flags of `weft router`, `weft eval` and `weft audit` (a nested
//! table such as `[audit.serve]` for a subcommand's own flags), keyed by the flag without its
//! dashes, `-` or `_` alike: `refresh_ms = 1000` is `--refresh-ms 1000`.
//!
//! Precedence stays flags > environment > file > defaults: a file value is used only for a
//! flag that neither the command line nor its environment variable set. A key that names no
//! flag of the command is an error, as everywhere else in the file.

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Command};

/// The sections read this way: the commands whose settings are their flags.
pub const SECTIONS: [&str; 3] = ["router", "eval", "audit"];

/// The first parse of `argv`, which finds the config file and the subcommand: a required
/// flag may be missing from it (the file may give it), so only `--help`, `--version` and
/// what cannot be parsed at all end it. The final parse, with the file's values, reports the
/// rest.
pub fn first_parse(cmd: &Command, argv: &[OsString]) -> Result<ArgMatches, clap::Error> {
    cmd.clone().ignore_errors(true).try_get_matches_from(argv)
}

/// The command line with the file's values for the flags it leaves at their defaults added.
/// `cmd` is the whole CLI, `argv` the process arguments, `matches` their [`first_parse`].
pub fn with_file_values(
    cmd: &Command,
    argv: Vec<OsString>,
    matches: &ArgMatches,
) -> anyhow::Result<Vec<OsString>> {
    let Some(path) = matches.get_one::<PathBuf>("config") else {
        return Ok(argv);
    };
    let Some((name, sub_matches)) = matches.subcommand() else {
        return Ok(argv);
    };
    if !SECTIONS.contains(&name) {
        return Ok(argv);
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config file {}", path.display()))?;
    let file: toml::Table =
        toml::from_str(&text).with_context(|| format!("parsing config file {}", path.display()))?;
    let Some(section) = file.get(name).and_then(toml::Value::as_table) else {
        return Ok(argv);
    };
    let Some(top) = cmd.find_subcommand(name) else {
        return Ok(argv);
    };
    check_keys(top, section, name)?;
    // The deepest subcommand run, and the tables that apply to it, outermost first: every
    // enclosing table applies (`[audit] tenant` reaches `weft audit check`), the nested
    // ones only as far as the file has them.
    let (mut run, mut m) = (top, sub_matches);
    let mut tables = vec![section];
    let mut nested = Some(section);
    while let Some((sub, sm)) = m.subcommand() {
        let Some(next) = run.find_subcommand(sub) else {
            break;
        };
        nested = nested
            .and_then(|t| t.get(sub))
            .and_then(toml::Value::as_table);
        tables.extend(nested);
        (run, m) = (next, sm);
    }
    let mut extra = Vec::new();
    for table in tables.into_iter().rev() {
        for (key, value) in table {
            if value.is_table() {
                continue;
            }
            let Some(arg) = find_arg(run, key) else {
                continue; // a parent's flag: valid, but not this subcommand's
            };
            let id = arg.get_id().as_str();
            if matches!(
                m.value_source(id),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            ) || extra.iter().any(|(k, _): &(String, _)| k == id)
            {
                continue;
            }
            let flags = flag_values(arg, key, value)?;
            extra.push((id.to_owned(), flags));
        }
    }
    let mut argv = argv;
    // Before a `--`, so the values stay flags.
    let at = argv.iter().position(|a| a == "--").unwrap_or(argv.len());
    let flags: Vec<OsString> = extra.into_iter().flat_map(|(_, f)| f).collect();
    argv.splice(at..at, flags);
    Ok(argv)
}

/// Every key of `table` names a flag of `cmd` or of one of its subcommands; every nested
/// table, one of its subcommands.
fn check_keys(cmd: &Command, table: &toml::Table, path: &str) -> anyhow::Result<()> {
    for (key, value) in table {
        if let Some(t) = value.as_table() {
            match cmd.find_subcommand(key) {
                Some(sub) => check_keys(sub, t, &format!("{path}.{key}"))?,
                None => bail!("[{path}]: `{key}` is not a subcommand of `weft {path}`"),
            }
        } else if !defines(cmd, key) {
            bail!(
                "[{path}]: unknown key `{key}` (the keys are the flags of `weft {}`)",
                path.replace('.', " ")
            );
        }
    }
    Ok(())
}

fn defines(cmd: &Command, key: &str) -> bool {
    find_arg(cmd, key).is_some() || cmd.get_subcommands().any(|s| defines(s, key))
}

fn find_arg<'c>(cmd: &'c Command, key: &str) -> Option<&'c clap::Arg> {
    let want = key.replace('_', "-");
    cmd.get_arguments()
        .find(|a| !a.is_global_set() && a.get_long() == Some(want.as_str()))
}

/// The command-line words that give `arg` the file's `value`.
fn flag_values(arg: &clap::Arg, key: &str, value: &toml::Value) -> anyhow::Result<Vec<OsString>> {
    let long = arg.get_long().unwrap_or(key);
    let scalar = |v: &toml::Value| -> anyhow::Result<String> {
        Ok(match v {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            toml::Value::Datetime(d) => d.to_string(),
            _ => bail!("`{key}`: expected a string, number or boolean"),
        })
    };
    if matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse) {
        let Some(on) = value.as_bool() else {
            bail!("`{key}`: expected true or false");
        };
        let wanted = matches!(arg.get_action(), ArgAction::SetTrue) == on;
        return Ok(if wanted {
            vec![format!("--{long}").into()]
        } else {
            Vec::new()
        });
    }
    match value {
        toml::Value::Array(items) => items
            .iter()
            .map(|v| Ok(format!("--{long}={}", scalar(v)?).into()))
            .collect(),
        v => Ok(vec![format!("--{long}={}", scalar(v)?).into()]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args, Parser, Subcommand};

    /// The table of every key of the flag sections, for docs/CONFIG.md (a test keeps the two
    /// equal): table, key, environment variable, default, and the flag's first help line.
    fn key_table(cli: &Command) -> String {
        let mut out = String::from(
            "| table | key | environment | default | meaning |\n|---|---|---|---|---|\n",
        );
        for name in SECTIONS {
            if let Some(cmd) = cli.find_subcommand(name) {
                table_rows(cmd, name, &mut out);
            }
        }
        out
    }

    fn table_rows(cmd: &Command, path: &str, out: &mut String) {
        for arg in cmd.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if arg.is_global_set() || arg.is_hide_set() || matches!(long, "help" | "version") {
                continue;
            }
            let env = arg
                .get_env()
                .map_or("—".to_owned(), |e| format!("`{}`", e.to_string_lossy()));
            let default: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            let default = match (default.is_empty(), arg.get_action()) {
                (true, ArgAction::SetTrue) => "`false`".to_owned(),
                (true, _) => "—".to_owned(),
                (false, _) => format!("`{}`", default.join(",")),
            };
            let help = arg
                .get_help()
                .map(|h| h.to_string())
                .unwrap_or_default()
                .lines()
                .next()
                .unwrap_or_default()
                .replace('|', "\\|");
            let key = long.replace('-', "_");
            out.push_str(&format!(
                "| `[{path}]` | `{key}` | {env} | {default} | {help} |\n"
            ));
        }
        for sub in cmd.get_subcommands() {
            if sub.get_name() != "help" {
                table_rows(sub, &format!("{path}.{}", sub.get_name()), out);
            }
        }
    }

    #[derive(Debug, Parser)]
    struct Cli {
        #[arg(long, global = true)]
        config: Option<PathBuf>,
        #[command(subcommand)]
        cmd: Cmd,
    }

    #[derive(Debug, Subcommand)]
    enum Cmd {
        Router(RouterArgs),
        Audit(AuditArgs),
    }

    #[derive(Debug, Args)]
    struct RouterArgs {
        #[arg(long, default_value = "127.0.0.1:8790")]
        listen: String,
        #[arg(long, default_value_t = 5000)]
        refresh_ms: u64,
        #[arg(long, default_value_t = 0.1)]
        epsilon: f64,
        #[arg(long)]
        allow_remote: bool,
    }

    #[derive(Debug, Args)]
    struct AuditArgs {
        #[command(subcommand)]
        action: AuditAction,
    }

    #[derive(Debug, Subcommand)]
    enum AuditAction {
        Serve {
            #[arg(long, default_value = "default")]
            tenant: String,
            #[arg(long, default_value = "127.0.0.1:8383")]
            listen: String,
        },
        Timeline {
            #[arg(long)]
            request: String,
            #[arg(long, default_value = "default")]
            tenant: String,
        },
    }

    fn parse(file: &str, args: &[&str]) -> anyhow::Result<Cli> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("weft.toml");
        std::fs::write(&path, file)?;
        let mut argv: Vec<OsString> = vec!["weft".into(), "--config".into(), path.into()];
        argv.extend(args.iter().map(OsString::from));
        let cmd = <Cli as clap::CommandFactory>::command();
        let m = first_parse(&cmd, &argv)?;
        let argv = with_file_values(&cmd, argv, &m)?;
        Ok(Cli::try_parse_from(argv)?)
    }

    fn router(cli: Cli) -> RouterArgs {
        match cli.cmd {
            Cmd::Router(r) => r,
            Cmd::Audit(_) => panic!("not the router"),
        }
    }

    #[test]
    fn the_file_fills_defaults_and_the_command_line_still_wins() {
        let file = "[router]\nlisten = \"127.0.0.1:9999\"\nrefresh-ms = 250\nallow_remote = true\n";
        let r = router(parse(file, &["router"]).unwrap());
        assert_eq!(
            (r.listen.as_str(), r.refresh_ms, r.allow_remote),
            ("127.0.0.1:9999", 250, true)
        );
        let r = router(parse(file, &["router", "--refresh-ms", "7"]).unwrap());
        assert_eq!((r.listen.as_str(), r.refresh_ms), ("127.0.0.1:9999", 7));
        let r = router(parse("", &["router"]).unwrap());
        assert_eq!((r.listen.as_str(), r.refresh_ms), ("127.0.0.1:8790", 5000));
    }

    #[test]
    fn a_subcommand_reads_its_own_table_over_the_section() {
        let file = "[audit]\ntenant = \"acme\"\nlisten = \"127.0.0.1:1\"\n[audit.serve]\nlisten = \"127.0.0.1:2\"\n";
        let cli = parse(file, &["audit", "serve"]).unwrap();
        let Cmd::Audit(AuditArgs {
            action: AuditAction::Serve { tenant, listen },
        }) = cli.cmd
        else {
            panic!("not audit serve");
        };
        assert_eq!((tenant.as_str(), listen.as_str()), ("acme", "127.0.0.1:2"));
    }

    /// `[audit] tenant` reaches every audit subcommand with a `--tenant`, with or without a
    /// table of its own; a required flag may come from the file alone.
    #[test]
    fn the_section_reaches_subcommands_without_a_table_and_fills_required_flags() {
        let file = "[audit]\ntenant = \"acme\"\n[audit.timeline]\nrequest = \"req-1\"\n";
        let Cmd::Audit(AuditArgs {
            action: AuditAction::Serve { tenant, .. },
        }) = parse(file, &["audit", "serve"]).unwrap().cmd
        else {
            panic!("not audit serve");
        };
        assert_eq!(tenant, "acme");
        let Cmd::Audit(AuditArgs {
            action: AuditAction::Timeline { request, tenant },
        }) = parse(file, &["audit", "timeline"]).unwrap().cmd
        else {
            panic!("not audit timeline");
        };
        assert_eq!((request.as_str(), tenant.as_str()), ("req-1", "acme"));
        // Missing from both, it is still the final parse's error.
        let err = parse("[audit]\ntenant = \"acme\"\n", &["audit", "timeline"]).unwrap_err();
        assert!(err.to_string().contains("--request"), "{err}");
    }

    #[test]
    fn docs_config_lists_every_key_of_the_flag_sections() {
        let table = key_table(&<crate::Cli as clap::CommandFactory>::command());
        let doc = include_str!("../docs/CONFIG.md");
        assert!(
            doc.contains(&table),
            "docs/CONFIG.md is out of date; its flag table should read:\n{table}"
        );
    }

    #[test]
    fn unknown_keys_and_tables_are_errors() {
        let err = parse("[router]\nrefresh = 1\n", &["router"]).unwrap_err();
        assert!(err.to_string().contains("unknown key `refresh`"), "{err}");
        let err = parse("[audit.serf]\nlisten = \"x\"\n", &["audit", "serve"]).unwrap_err();
        assert!(err.to_string().contains("not a subcommand"), "{err}");
        let err = parse("[router]\nrefresh_ms = \"soon\"\n", &["router"]).unwrap_err();
        assert!(err.to_string().contains("refresh-ms"), "{err}");
    }
}
