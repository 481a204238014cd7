//! Each fuzz target over its committed corpus (gateway/fuzz/corpus/<target>), the inputs
//! `ci/fuzz` starts from: every one must still pass.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use berth_fuzz_targets::{lifecycle, requests, store};

fn replay(target: &str, fuzz: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target);
    let mut inputs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    inputs.sort();
    // The corpora hold hundreds of inputs each: an empty folder would pass vacuously.
    assert!(inputs.len() >= 100, "{} holds only {} inputs", dir.display(), inputs.len());
    for input in inputs {
        let data = std::fs::read(&input).unwrap();
        if catch_unwind(AssertUnwindSafe(|| fuzz(&data))).is_err() {
            panic!(
                "the {target} target failed on {}; reproduce: RUSTC_BOOTSTRAP=1 cargo fuzz run --fuzz-dir gateway/fuzz --dev {target} {}",
                input.display(),
                input.display()
            );
        }
    }
}

#[test]
fn requests_corpus_passes() {
    replay("requests", requests::fuzz);
}

#[test]
fn lifecycle_corpus_passes() {
    replay("lifecycle", lifecycle::fuzz);
}

#[test]
fn store_corpus_passes() {
    replay("store", store::fuzz);
}
