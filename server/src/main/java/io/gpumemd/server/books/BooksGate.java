package io.gpumemd.server.books;

/**
 * What a change to the books passes while a take-over may be writing them down: the daemon's
 * {@code takeover.HandOverGate}, seen by parts outside the take-over that change the books on
 * their own threads (the fd channel's grants make descriptor holders). A change let in ({@link
 * #enter}) is counted until it {@link #exit}s, so that a hand-over exports books nothing changes
 * under; a change refused is not made, and may wait for the hand-over's end ({@link #hold}).
 *
 * <p>Implementations are thread-safe.
 */
public interface BooksGate {
  /** A gate that never closes: daemons without a take-over, tests of one part. */
  BooksGate ALWAYS_OPEN = new BooksGate() {
    @Override
    public boolean enter() {
      return true;
    }

    @Override
    public void exit() {}

    @Override
    public boolean closed() {
      return false;
    }

    @Override
    public boolean hold(Outcome outcome) {
      return false;
    }
  };

  /** What a change refused while handing over does when the hand-over ends ({@link #hold}). */
  interface Outcome {
    /**
     * @param moved true: the successor serves and this daemon sent its connections away (the
     *     change belongs there now); false: the gate opened again (make it here)
     */
    void ended(boolean moved);
  }

  /**
   * Starts a change.
   *
   * @return false when the gate is closed: the change must not be made (and not {@link #exit}ed)
   */
  boolean enter();

  /** Ends a change that {@link #enter} let in. */
  void exit();

  /** True while closed: no change is made. */
  boolean closed();

  /**
   * Lets a change that {@link #enter} refused wait for the end of the hand-over that has the gate
   * closed; {@code outcome} is given once, on the thread that ends the hand-over.
   *
   * @return false when nothing is held (no hand-over has the gate closed, or it ended): decide now
   */
  boolean hold(Outcome outcome);
}
