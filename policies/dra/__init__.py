"""DRA in the engine: claims and DeviceClasses as the scheduler reads them (``claim_docs``), its
first fit over published ResourceSlices (``claims``, ``slice_devices``), the order slices list
devices in (``order``) and the checks of ``cdigen dra check`` (``check``). The device view both
wings share lives in :mod:`cdigen.policies.device_view`."""
