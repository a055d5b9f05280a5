#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| preflight::fuzzing::second_pass_table(data));
