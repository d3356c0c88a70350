//! Writes the CRDs the API types generate to `crds/generated/` (or prints them with `--stdout`),
//! and the ScalePolicy field reference to `docs/scalepolicy-reference.md`.
//! CI fails when the committed YAML differs from what the types generate.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let stdout = std::env::args().any(|a| a == "--stdout");
    let out_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("generated");
    for (file, yaml) in runner_manager_crds::crd_documents() {
        let yaml = match yaml {
            Ok(y) => y,
            Err(e) => {
                eprintln!("crdgen: cannot render {file}: {e}");
                return ExitCode::FAILURE;
            }
        };
        if stdout {
            print!("---\n{yaml}");
            continue;
        }
        let path = out_dir.join(file);
        if let Err(e) = std::fs::create_dir_all(&out_dir).and_then(|()| std::fs::write(&path, yaml))
        {
            eprintln!("crdgen: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("wrote {}", path.display());
    }
    if !stdout {
        // The ScalePolicy field reference, generated from the same schema.
        let path =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/scalepolicy-reference.md");
        if let Err(e) = std::fs::write(
            &path,
            runner_manager_crds::reference::scalepolicy_markdown(),
        ) {
            eprintln!("crdgen: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("wrote {}", path.display());
    }
    ExitCode::SUCCESS
}
