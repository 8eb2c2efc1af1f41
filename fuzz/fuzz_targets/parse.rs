#![no_main]
//! cargo fuzz run parse (docs/fuzzing.md); the body is trn3emu_fuzz::fuzz_parse.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    trn3emu_fuzz::fuzz_parse(data);
});
