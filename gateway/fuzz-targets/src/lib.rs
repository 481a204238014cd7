//! The fuzz targets, apart from libFuzzer: cargo-fuzz runs each `fuzz` under libFuzzer
//! (gateway/fuzz, `ci/fuzz`), and the workspace's tests run it over the committed corpus
//! (tests/corpus.rs), so a target cannot stop building or start failing on the inputs it has
//! already been fed without `cargo test` saying so.

use arbitrary::{Arbitrary, Unstructured};

pub mod lifecycle;
pub mod requests;
pub mod store;

/// Decodes `data` as libFuzzer-sys's typed targets do (the rest of the bytes go to the last
/// field), skipping bytes that are no `T`, and checks the result.
fn run<'a, T: Arbitrary<'a>>(data: &'a [u8], check: impl FnOnce(T)) {
    if let Ok(input) = T::arbitrary_take_rest(Unstructured::new(data)) {
        check(input);
    }
}
