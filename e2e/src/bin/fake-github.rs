//! `fake-github`: serves the simulated GitHub on a loopback port and prints
//! `listening on http://127.0.0.1:<port>` as its first line.
//!
//! Options: `--bind ADDR` (the IPv4/IPv6 address to listen on, default 127.0.0.1: pods of the
//! real node reach the host only at the host end of its veth, e2e/cluster/env.sh's `HOST_IP`;
//! every URL the fake hands out, its package download included, then names that address),
//! `--port N` (default 0: any free port), `--package PATH` (serve this runner package),
//! `--listener-bin PATH` (build the stand-in package from this binary; default: the
//! `standin-runner-listener` next to this one), `--package-files N`, `--package-bytes N`,
//! `--package-dir DIR` (where to build it; default a temp directory), `--no-package`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use runner_manager_e2e::fake_github;
use runner_manager_e2e::standin_runner::package::{self, PackageSpec};

#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error("{0} needs a value")]
    Missing(String),
    #[error("{0}: not a number")]
    NotNumber(String),
    #[error("{0}: not an IP address")]
    NotAddress(String),
    #[error("unknown option {0}")]
    Unknown(String),
    #[error(transparent)]
    Package(#[from] package::PackageError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

#[derive(Debug)]
struct Options {
    bind: IpAddr,
    port: u16,
    package: Option<PathBuf>,
    listener_bin: Option<PathBuf>,
    files: Option<u64>,
    bytes: Option<u64>,
    dir: Option<PathBuf>,
    no_package: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 0,
            package: None,
            listener_bin: None,
            files: None,
            bytes: None,
            dir: None,
            no_package: false,
        }
    }
}

fn parse(args: &[String]) -> Result<Options, CliError> {
    let mut o = Options::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| CliError::Missing(a.clone()))
        };
        let num = |v: String| v.parse::<u64>().map_err(|_| CliError::NotNumber(v));
        match a.as_str() {
            "--bind" => {
                let v = value()?;
                o.bind = v.parse().map_err(|_| CliError::NotAddress(v))?;
            }
            "--port" => {
                let v = value()?;
                o.port = v.parse().map_err(|_| CliError::NotNumber(v))?;
            }
            "--package" => o.package = Some(value()?.into()),
            "--listener-bin" => o.listener_bin = Some(value()?.into()),
            "--package-files" => o.files = Some(num(value()?)?),
            "--package-bytes" => o.bytes = Some(num(value()?)?),
            "--package-dir" => o.dir = Some(value()?.into()),
            "--no-package" => o.no_package = true,
            other => return Err(CliError::Unknown(other.to_owned())),
        }
    }
    Ok(o)
}

fn package_info(o: &Options) -> Result<Option<fake_github::PackageInfo>, CliError> {
    if o.no_package {
        return Ok(None);
    }
    if let Some(path) = &o.package {
        let spec_name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let version = spec_name
            .trim_start_matches("actions-runner-linux-x64-")
            .trim_end_matches(".tar.gz")
            .to_owned();
        let bytes = std::fs::read(path)?;
        use sha2::Digest;
        return Ok(Some(fake_github::PackageInfo {
            version,
            file_name: spec_name,
            sha256: hex::encode(sha2::Sha256::digest(&bytes)),
            size: bytes.len() as u64,
            path: path.clone(),
        }));
    }
    let listener = match &o.listener_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name("standin-runner-listener"),
    };
    let mut spec = PackageSpec::small(listener);
    if let Some(f) = o.files {
        spec.filler_files = f;
    }
    if let Some(b) = o.bytes {
        spec.filler_bytes = b;
    }
    let dir = match &o.dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("fake-github-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)?;
    Ok(Some(package::build(&spec, &dir)?))
}

async fn run(args: &[String]) -> Result<(), CliError> {
    let o = parse(args)?;
    let pkg = package_info(&o)?;
    let running = fake_github::start(SocketAddr::from((o.bind, o.port)), pkg).await?;
    println!("listening on {}", running.base_url);
    if let Some(p) = &running.fake.package {
        println!(
            "package {} sha256 {} at {}",
            p.file_name,
            p.sha256,
            p.path.display()
        );
    }
    match running.server.await {
        Ok(result) => result?,
        Err(e) => return Err(std::io::Error::other(e).into()),
    }
    Ok(())
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = run(&args).await {
        eprintln!("fake-github: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn binds_loopback_unless_told() {
        let o = parse(&[]).expect("no options");
        assert_eq!(o.bind, IpAddr::V4(Ipv4Addr::LOCALHOST));
        let o = parse(&args(&["--bind", "10.213.7.1", "--port", "0"])).expect("bind");
        assert_eq!(o.bind, "10.213.7.1".parse::<IpAddr>().expect("ip"));
        assert!(matches!(
            parse(&args(&["--bind", "node.local"])),
            Err(CliError::NotAddress(_))
        ));
    }
}
