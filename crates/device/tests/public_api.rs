//! Exercises the public API the way the layers above use it: devices behind `DeviceRef`.

use std::sync::Arc;

use tank_device::{
    BlockDevice, CrashMode, DeviceError, DeviceRef, EmulatedDevice, FileDevice, FileDeviceOptions,
    MemDevice, NullTiming, SimFleet,
};

#[test]
fn crash_images_remount_as_mem_devices() {
    let fleet = SimFleet::new(0xC0FFEE);
    let devs: Vec<DeviceRef> = (0..3)
        .map(|i| Arc::new(fleet.device(&format!("sim{i}"), 1 << 20)) as DeviceRef)
        .collect();
    for (i, d) in devs.iter().enumerate() {
        d.write_at(&[i as u8 + 1; 4096], 0).unwrap();
        d.flush().unwrap();
        d.write_at(&[0xFF; 4096], 4096).unwrap();
    }
    assert_eq!(fleet.ops(), 9);
    fleet.set_crash_at(Some(fleet.ops()));
    assert!(matches!(
        devs[0].flush(),
        Err(DeviceError::Injected {
            what: "crashed",
            ..
        })
    ));
    drop(devs);

    for (i, (name, image)) in fleet
        .crash_images(CrashMode::DropUnflushed)
        .into_iter()
        .enumerate()
    {
        assert_eq!(name, format!("sim{i}"));
        let mem = MemDevice::from_bytes(name, image);
        let mut buf = vec![0; 8192];
        mem.read_at(&mut buf, 0).unwrap();
        assert!(buf[..4096].iter().all(|&b| b == i as u8 + 1));
        assert!(buf[4096..].iter().all(|&b| b == 0));
    }
}

#[test]
fn emulated_file_device_on_tmpfs_or_disk() {
    // /dev/shm is usually tmpfs, where O_DIRECT may be refused: the fallback must work.
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap_or_else(|_| tempfile::tempdir().unwrap())
    } else {
        tempfile::tempdir().unwrap()
    };
    let opts = FileDeviceOptions {
        direct: true,
        create_size: Some(1 << 20),
        exclusive_lock: true,
        ..FileDeviceOptions::default()
    };
    let file = FileDevice::open(&dir.path().join("disk"), &opts).unwrap();
    eprintln!("direct: {}", file.is_direct());
    let dev = EmulatedDevice::new(Arc::new(file), Arc::new(NullTiming));
    let data: Vec<u8> = (0..8193).map(|i| (i % 256) as u8).collect();
    dev.write_at(&data[1..], 512).unwrap();
    dev.flush().unwrap();
    let mut back = vec![0; 8193];
    dev.read_at(&mut back[1..], 512).unwrap();
    assert_eq!(back[1..], data[1..]);
    dev.trim(0, 4096).unwrap();
}
