#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| berth_fuzz_targets::requests::fuzz(data));
