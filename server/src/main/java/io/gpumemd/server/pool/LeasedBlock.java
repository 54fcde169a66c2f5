package io.gpumemd.server.pool;

/**
 * What {@link DevicePool#lease} hands out: the block, and whether it came from cached memory.
 * The hit flag travels here rather than on the {@link Block}, which belongs to whoever leases
 * it next as soon as it is released. Immutable.
 */
public record LeasedBlock(Block block, boolean poolHit) {}
