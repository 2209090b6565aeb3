#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tank_object::fuzz::l2arc_log_block(data));
