package io.gpumemd.server.config;

/**
 * A quota as the operator set it: most bytes and leases held at once, 0 = unlimited. The session
 * layer makes its own quotas from these.
 *
 * @param maxLeasedBytes most bytes held leased at once
 * @param maxLeases most leases held at once
 */
public record QuotaConfig(long maxLeasedBytes, long maxLeases) {
  public static final QuotaConfig UNLIMITED = new QuotaConfig(0, 0);
}
