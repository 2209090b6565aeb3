#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tank_block::fuzz::space_map(data));
