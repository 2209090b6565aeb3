//! Entry points for the fuzz targets (`fuzz/`, see docs/FUZZING.md): the dataset layer's
//! on-disk records fed arbitrary bytes. Each may refuse anything; none may panic.

/// The dataset directory's header, dataset records and deadlist headers.
pub fn dataset_records(data: &[u8]) {
    crate::dsl::fuzz_records(data);
}

/// Inodes, directory entries and extended attribute headers.
pub fn posix_records(data: &[u8]) {
    crate::posix::fuzz_records(data);
}

/// The send stream: raw, and cut into records given their checksums.
pub fn send_stream(data: &[u8]) {
    crate::stream::fuzz_stream(data);
}
