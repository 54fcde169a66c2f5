package io.gpumemd.server.takeover;

/**
 * Why a take-over cannot happen, in words an operator acts on: the running daemon answers its
 * would-be successor with it and carries on untouched.
 */
public final class TakeOverRefusal extends Exception {
  private static final long serialVersionUID = 1L;

  public TakeOverRefusal(String reason) {
    super(reason);
  }
}
