//! `gpudiag man`: the man pages, generated from the clap definition itself, so they cannot fall
//! behind a new flag or subcommand. gpudiag(1) and one gpudiag-SUBCOMMAND(1) per subcommand.

use std::path::{Path, PathBuf};

use clap::CommandFactory;
use clap_mangen::roff::{Roff, roman};

use gpudiag_model::error::{Error, exit};

use crate::cli::{Cli, ManArgs};

/// `gpudiag man [SUBCOMMAND]` prints one page; `gpudiag man --all DIR` writes them all and
/// lists the files written.
pub fn man(args: &ManArgs) -> Result<i32, Error> {
    if let Some(dir) = &args.all {
        let written = write_all(dir)?;
        let list: String = written
            .iter()
            .map(|path| format!("{}\n", path.display()))
            .collect();
        super::print_text(&list)?;
        return Ok(exit::OK);
    }
    let page = match &args.subcommand {
        None => man_page()?,
        Some(name) => subcommand_page(name)?,
    };
    super::print(&page)?;
    Ok(exit::OK)
}

/// The command the pages are built from. Built, so that each subcommand carries its page name
/// (`gpudiag-check`) and its usage line (`gpudiag check`); without clap's `help` subcommand,
/// which would otherwise be listed with a page that does not exist.
fn command() -> clap::Command {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    cmd
}

/// The subcommands that have a page, in the order `--help` lists them.
pub fn subcommand_names() -> Vec<String> {
    command()
        .get_subcommands()
        .filter(|sub| !sub.is_hide_set())
        .map(|sub| sub.get_name().to_owned())
        .collect()
}

/// gpudiag(1): name, synopsis, the global options, each subcommand with its summary and page,
/// exit status, and the version with its commit.
pub fn man_page() -> Result<String, Error> {
    render(&command(), None)
}

/// gpudiag-NAME(1); an unknown NAME is a usage error that lists the pages there are.
pub fn subcommand_page(name: &str) -> Result<String, Error> {
    let top = command();
    let sub = top
        .get_subcommands()
        .find(|sub| sub.get_name() == name && !sub.is_hide_set())
        .ok_or_else(|| {
            Error::Usage(format!(
                "no man page for {name:?}: the pages are gpudiag(1) (`gpudiag man`) and \
                 gpudiag-SUBCOMMAND(1) for {}",
                subcommand_names().join(", ")
            ))
        })?;
    render(sub, Some(&top))
}

/// Writes gpudiag.1 and every gpudiag-SUBCOMMAND.1 into `dir` (created if missing; pages of
/// those names already there are replaced, since a packaging script reruns it), and returns
/// their paths.
pub fn write_all(dir: &Path) -> Result<Vec<PathBuf>, Error> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let mut pages = vec![("gpudiag".to_owned(), man_page()?)];
    for name in subcommand_names() {
        pages.push((format!("gpudiag-{name}"), subcommand_page(&name)?));
    }
    let mut written = Vec::new();
    for (title, page) in pages {
        let path = dir.join(format!("{title}.1"));
        std::fs::write(&path, page)
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
        written.push(path);
    }
    Ok(written)
}

/// One page in the usual order: NAME, SYNOPSIS, DESCRIPTION, OPTIONS, SUBCOMMANDS (gpudiag(1)
/// only), then the help footer split into its sections (EXIT STATUS, EXAMPLES, ...), SEE ALSO,
/// VERSION. clap_mangen puts the whole footer under one heading, which would bury the exit codes.
fn render(cmd: &clap::Command, parent: Option<&clap::Command>) -> Result<String, Error> {
    let version = gpudiag_model::build_info::LONG_VERSION;
    let man = clap_mangen::Man::new(cmd.clone()).source(format!("gpudiag {version}"));
    let mut parts: Vec<Vec<u8>> = Vec::new();
    let mut part = |render: &dyn Fn(&mut Vec<u8>) -> std::io::Result<()>| -> Result<(), Error> {
        let mut out = Vec::new();
        render(&mut out).map_err(|e| Error::io("rendering the man page", e))?;
        parts.push(out);
        Ok(())
    };
    part(&|w| man.render_title(w))?;
    part(&|w| man.render_name_section(w))?;
    part(&|w| man.render_synopsis_section(w))?;
    part(&|w| man.render_description_section(w))?;
    if cmd.get_arguments().any(|arg| !arg.is_hide_set()) {
        part(&|w| man.render_options_section(w))?;
    }
    if cmd.get_subcommands().any(|sub| !sub.is_hide_set()) {
        part(&|w| man.render_subcommands_section(w))?;
    }
    let footer = cmd
        .get_after_long_help()
        .or_else(|| cmd.get_after_help())
        .map(|help| help.to_string())
        .unwrap_or_default();
    let mut roff = Roff::new();
    for (heading, lines) in footer_sections(&footer) {
        roff.control("SH", [heading.as_str()]);
        // No-fill: the footers are laid out in columns (an exit code and its meaning, an
        // example and what it does), which filling would run together.
        roff.control("nf", []);
        for line in lines {
            roff.text([roman(line)]);
        }
        roff.control("fi", []);
    }
    roff.control("SH", ["SEE ALSO"]);
    let see_also = match parent {
        None => subcommand_names()
            .iter()
            .map(|name| format!("gpudiag-{name}(1)"))
            .collect::<Vec<_>>()
            .join(", "),
        Some(_) => "gpudiag(1), which lists every subcommand and its page".to_owned(),
    };
    roff.text([roman(see_also)]);
    roff.control("SH", ["VERSION"]);
    roff.text([roman(format!("v{version}"))]);
    parts.push(roff.render().into_bytes());

    // Each part was rendered with the preamble that defines the apostrophe string; once, at
    // the top, is enough.
    let preamble = Roff::new().render();
    let mut page = String::new();
    for (i, part) in parts.iter().enumerate() {
        // roff built from the command definition, which is UTF-8.
        let text = String::from_utf8_lossy(part);
        page.push_str(if i == 0 {
            &text
        } else {
            text.strip_prefix(preamble.as_str()).unwrap_or(&text)
        });
    }
    Ok(page)
}

/// The help footer as man page sections: a paragraph that opens with `Examples:` (or `Example:`)
/// goes under EXAMPLES, `Exit codes:` under EXIT STATUS, `Install:` under INSTALL, anything else
/// under NOTES; the heading line itself is dropped, the rest kept as it reads in `--help`.
fn footer_sections(footer: &str) -> Vec<(String, Vec<&str>)> {
    let mut sections: Vec<(String, Vec<&str>)> = Vec::new();
    for paragraph in footer.split("\n\n").filter(|p| !p.trim().is_empty()) {
        let mut lines: Vec<&str> = paragraph.lines().collect();
        let heading = match lines.first().map(|line| line.trim_end()) {
            Some("Examples:" | "Example:") => "EXAMPLES",
            Some("Exit codes:") => "EXIT STATUS",
            Some("Install:") => "INSTALL",
            _ => "NOTES",
        };
        if heading != "NOTES" {
            lines.remove(0);
        }
        match sections.iter_mut().find(|(h, _)| h == heading) {
            Some((_, kept)) => {
                kept.push("");
                kept.extend(lines);
            }
            None => sections.push((heading.to_owned(), lines)),
        }
    }
    // The order a reader of man pages expects.
    let rank = |heading: &str| match heading {
        "NOTES" => 0,
        "EXIT STATUS" => 1,
        "INSTALL" => 2,
        _ => 3,
    };
    sections.sort_by_key(|(heading, _)| rank(heading));
    sections
}
