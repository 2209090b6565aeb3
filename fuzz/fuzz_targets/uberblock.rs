#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tank_pool::fuzz::uberblock(data));
