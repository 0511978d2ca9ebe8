//! The release (`scripts/release`): the version written only in Cargo.toml and agreed with
//! wherever a file has to spell it out; the tarball's layout (`scripts/release list`) shipping
//! every deployment file and agreeing with the Debian package's assets
//! (`[package.metadata.deb]`); the unit the package installs. Building the release and
//! installing the package into a fresh Debian root need the network and root: CI runs them
//! (`scripts/release` and `scripts/release check` in `.ci/run`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use crate::support::{at, gpudiag};

fn cargo_toml() -> toml::Table {
    toml::from_str(&std::fs::read_to_string(at("Cargo.toml")).unwrap()).unwrap()
}

fn version() -> String {
    cargo_toml()["workspace"]["package"]["version"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn release(args: &[&str]) -> String {
    let out = Command::new("bash")
        .arg(at("scripts/release"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/release {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Every `gpudiag:TAG` in `text`: image references to our image.
fn image_tags(text: &str) -> Vec<String> {
    text.match_indices("gpudiag:")
        .filter(|(i, _)| {
            // `gpudiag:` preceded by `/`, a space or `=`: an image, not a YAML key such as
            // `app.kubernetes.io/name: gpudiag`.
            text[..*i]
                .chars()
                .next_back()
                .is_some_and(|c| c == '/' || c == ' ' || c == '=')
        })
        .map(|(i, m)| {
            text[i + m.len()..]
                .chars()
                .take_while(|c| !c.is_whitespace() && *c != '"' && *c != '\'')
                .collect()
        })
        .filter(|tag: &String| !tag.is_empty())
        .collect()
}

#[test]
fn the_version_is_cargo_tomls_wherever_a_file_names_it() {
    let version = version();
    let own = cargo_toml()["package"]["version"].clone();
    assert_eq!(
        own.get("workspace").and_then(toml::Value::as_bool),
        Some(true),
        "the binary's version comes from [workspace.package]"
    );

    // The binary says it.
    let out = gpudiag().arg("--version").output().unwrap();
    let said = String::from_utf8(out.stdout).unwrap();
    assert!(said.starts_with(&format!("gpudiag {version} ")), "{said}");

    // The image is built with the tag the release script reads from Cargo.toml.
    let containerfile =
        std::fs::read_to_string(at("assets/deploy/kubernetes/Containerfile")).unwrap();
    let tags = image_tags(&containerfile);
    assert!(
        !tags.is_empty(),
        "the Containerfile shows how to tag the image"
    );
    for tag in &tags {
        assert_eq!(tag, "$(scripts/release", "a tag written out: {tag}");
    }
    assert!(containerfile.contains("gpudiag:$(scripts/release version)"));
    assert_eq!(release(&["version"]).trim(), version);

    // The manifest runs that image.
    let manifest = std::fs::read_to_string(at("assets/deploy/kubernetes/gpudiag.yaml")).unwrap();
    let tags = image_tags(&manifest);
    assert_eq!(
        tags,
        std::slice::from_ref(&version),
        "gpudiag.yaml's image tags"
    );

    // The install page names the artifacts of this version.
    let install = std::fs::read_to_string(at("docs/install.md")).unwrap();
    let mut named = 0;
    for (prefix, after) in [
        ("gpudiag_", "-1_amd64.deb"),
        ("gpudiag-", "-x86_64-linux-gnu"),
    ] {
        for (i, _) in install.match_indices(prefix) {
            let rest = &install[i + prefix.len()..];
            if let Some(end) = rest.find(after)
                && rest[..end].chars().all(|c| c.is_ascii_digit() || c == '.')
                && end > 0
            {
                assert_eq!(
                    &rest[..end],
                    version,
                    "docs/install.md: {prefix}{}",
                    &rest[..end]
                );
                named += 1;
            }
        }
    }
    assert!(named >= 2, "docs/install.md names the .deb and the tarball");

    // The changelog has a section for it, or the one for what is not yet released.
    let changelog = std::fs::read_to_string(at("CHANGELOG.md")).unwrap();
    let first = changelog
        .lines()
        .find_map(|l| l.strip_prefix("## "))
        .unwrap();
    assert!(
        first == "Unreleased" || first.starts_with(&version),
        "CHANGELOG.md's first section is {first}"
    );
}

/// `scripts/release list`: (source, path in the tarball).
fn layout() -> Vec<(String, String)> {
    release(&["list"])
        .lines()
        .map(|l| {
            let (source, dest) = l.split_once('\t').unwrap();
            (source.to_owned(), dest.to_owned())
        })
        .collect()
}

fn files_under(dir: &Path, found: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_under(&path, found);
        } else {
            let rel = path.strip_prefix(at("")).unwrap();
            found.push(rel.to_str().unwrap().to_owned());
        }
    }
}

/// A source pattern of the package's assets, `*` in its last component only, as the files it
/// names.
fn expand(pattern: &str) -> Vec<String> {
    let Some((dir, name)) = pattern.rsplit_once('/') else {
        return vec![pattern.to_owned()];
    };
    let Some((before, after)) = name.split_once('*') else {
        return vec![pattern.to_owned()];
    };
    let mut found: Vec<String> = std::fs::read_dir(at(dir))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(before) && n.ends_with(after))
        .map(|n| format!("{dir}/{n}"))
        .collect();
    found.sort();
    assert!(!found.is_empty(), "{pattern} matches nothing");
    found
}

/// `[package.metadata.deb]`'s assets: (source pattern, destination, mode).
fn package_assets() -> Vec<(String, String, String)> {
    let toml = cargo_toml();
    toml["package"]["metadata"]["deb"]["assets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let a = a.as_array().unwrap();
            let s = |i: usize| a[i].as_str().unwrap().to_owned();
            (s(0), s(1), s(2))
        })
        .collect()
}

#[test]
fn the_tarball_ships_every_deployment_file_and_what_the_package_installs() {
    let layout = layout();
    let dests: BTreeSet<&str> = layout.iter().map(|(_, d)| d.as_str()).collect();
    assert_eq!(dests.len(), layout.len(), "two files to one path");
    let by_source: BTreeMap<&str, &str> = layout
        .iter()
        .map(|(s, d)| (s.as_str(), d.as_str()))
        .collect();

    for (source, dest) in &layout {
        if !source.starts_with('@') {
            assert!(at(source).is_file(), "{source} is not in the repository");
        }
        assert!(
            !dest.starts_with('/') && !dest.contains(".."),
            "{dest} leaves the tarball's directory"
        );
    }
    // Every deployment file, the rules, the dashboard, the schemas (docs/versions.md: they ship
    // with each release), the licences, README and CHANGELOG.
    let mut wanted = Vec::new();
    files_under(&at("assets/deploy"), &mut wanted);
    files_under(&at("assets/schema"), &mut wanted);
    wanted.extend(
        [
            "assets/prometheus/gpudiag-rules.yml",
            "assets/grafana/gpudiag.json",
            "LICENSE-MIT",
            "LICENSE-APACHE",
            "README.md",
            "CHANGELOG.md",
            "docs/install.md",
        ]
        .map(str::to_owned),
    );
    for file in &wanted {
        assert!(
            by_source.contains_key(file.as_str()),
            "{file} is not in the tarball"
        );
    }
    for generated in [
        "@binary",
        "@man",
        "@completion-bash",
        "@completion-zsh",
        "@completion-fish",
    ] {
        assert!(by_source.contains_key(generated), "{generated}");
    }
    assert_eq!(by_source["@binary"], "bin/gpudiag");

    // What the package installs under /usr/share/gpudiag/ is where the tarball has it under
    // share/gpudiag/, from the same file and with the same mode.
    let script = std::fs::read_to_string(at("scripts/release")).unwrap();
    let mut shared = 0;
    for (pattern, dest, mode) in package_assets() {
        if let Some(generated) = pattern.strip_prefix("target/release/") {
            // Made by the script beside the binary it builds (cargo-deb's target/release/).
            let (file, _) = generated.split_once('*').unwrap_or((generated, ""));
            let written = if file == "gpudiag" {
                "--bin gpudiag".to_owned()
            } else {
                format!("$gen/{}", file.trim_start_matches("package/"))
            };
            assert!(
                script.contains(&written),
                "the package takes {pattern}, which scripts/release does not write"
            );
            continue;
        }
        for source in expand(&pattern) {
            let executable = {
                use std::os::unix::fs::PermissionsExt;
                std::fs::metadata(at(&source)).unwrap().permissions().mode() & 0o111 != 0
            };
            assert_eq!(
                mode == "755",
                executable,
                "{source}: mode {mode} in the package, executable {executable} in the repository"
            );
            let Some(under) = dest.strip_prefix("usr/share/gpudiag/") else {
                if source.starts_with("scripts/package/") {
                    // Debian's own: the lintian overrides.
                    continue;
                }
                assert!(
                    by_source.contains_key(source.as_str()),
                    "the package ships {source}, the tarball does not"
                );
                continue;
            };
            let file_name = Path::new(&source).file_name().unwrap().to_str().unwrap();
            let packaged = if dest.ends_with('/') {
                format!("share/gpudiag/{under}{file_name}")
            } else {
                format!("share/gpudiag/{under}")
            };
            assert_eq!(
                by_source.get(source.as_str()).copied(),
                Some(packaged.as_str()),
                "{source}: the package puts it at /{dest}"
            );
            shared += 1;
        }
    }
    assert!(shared >= 8, "{shared} files under /usr/share/gpudiag");
    // The package's copy of the Slurm scripts, rules and dashboard: all of them.
    for dir in [
        "share/gpudiag/slurm/",
        "share/gpudiag/prometheus/gpudiag-rules",
    ] {
        let in_tarball = dests.iter().filter(|d| d.starts_with(dir)).count();
        let in_package = package_assets()
            .iter()
            .filter(|(p, _, _)| !p.starts_with("target/"))
            .flat_map(|(p, d, _)| expand(p).into_iter().map(move |s| (s, d.clone())))
            .filter(|(s, _)| {
                by_source
                    .get(s.as_str())
                    .is_some_and(|d| d.starts_with(dir))
            })
            .count();
        assert_eq!(in_tarball, in_package, "{dir}: tarball and package differ");
    }
}

#[test]
fn the_package_installs_the_shipped_unit_with_its_binary_in_usr_bin() {
    let shipped =
        std::fs::read_to_string(at("assets/deploy/systemd/gpudiag-serve.service")).unwrap();
    let packaged = release(&["unit"]);
    let settings = |unit: &str| -> Vec<String> {
        unit.lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(str::to_owned)
            .collect()
    };
    let (shipped_settings, packaged_settings) = (settings(&shipped), settings(&packaged));
    assert_eq!(shipped_settings.len(), packaged_settings.len());
    let differ: Vec<(&String, &String)> = shipped_settings
        .iter()
        .zip(&packaged_settings)
        .filter(|(a, b)| a != b)
        .collect();
    assert_eq!(differ.len(), 1, "only ExecStart changes: {differ:?}");
    assert!(differ[0].0.starts_with("ExecStart=/usr/local/bin/gpudiag "));
    assert_eq!(
        differ[0].1,
        &differ[0]
            .0
            .replace("/usr/local/bin/gpudiag", "/usr/bin/gpudiag")
    );
    assert!(!packaged.contains("/usr/local"), "{packaged}");
    // The package ships it, and no script of its own that would enable or start it.
    let assets = package_assets();
    assert!(
        assets
            .iter()
            .any(|(p, d, _)| p.ends_with("/gpudiag-serve.service") && d == "lib/systemd/system/")
    );
    let deb = &cargo_toml()["package"]["metadata"]["deb"];
    assert!(deb.get("maintainer-scripts").is_none());
    assert!(deb.get("systemd-units").is_none());
}

#[test]
fn the_packages_copyright_file_carries_the_licences_as_they_are() {
    let deb = &cargo_toml()["package"]["metadata"]["deb"];
    let file = deb["license-file"].as_array().unwrap()[0].as_str().unwrap();
    let copyright = std::fs::read_to_string(at(file)).unwrap();
    assert!(copyright.starts_with(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"
    ));
    // The licence the workspace declares, in DEP-5's spelling.
    let declared = cargo_toml()["workspace"]["package"]["license"]
        .as_str()
        .unwrap()
        .replace(" OR ", " or ");
    assert!(
        copyright.contains(&format!("\nLicense: {declared}\n")),
        "{file} does not say License: {declared}"
    );
    // The MIT text, as DEP-5 indents it (an empty line is a lone dot), is LICENSE-MIT's.
    let mit = copyright
        .split_once("\nLicense: MIT\n")
        .expect("a License: MIT paragraph")
        .1;
    let unindented: String = mit
        .lines()
        .map(|l| {
            let l = l.strip_prefix(' ').expect("a continuation line");
            if l == "." {
                "\n".to_owned()
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    assert_eq!(
        unindented,
        std::fs::read_to_string(at("LICENSE-MIT")).unwrap()
    );
    assert!(copyright.contains("/usr/share/common-licenses/Apache-2.0"));
}
