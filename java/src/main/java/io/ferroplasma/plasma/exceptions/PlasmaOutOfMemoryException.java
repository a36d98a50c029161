package io.ferroplasma.plasma.exceptions;

/**
 * No room for the object, even after evicting every object nobody uses (or it is larger than the
 * whole store). Free some (release, delete) or start the store with more {@code --memory}.
 */
public class PlasmaOutOfMemoryException extends PlasmaClientException {
  private static final long serialVersionUID = 1L;

  /** The store had no room (status {@code FP_STORE_FULL}). */
  public PlasmaOutOfMemoryException(int status, String message) {
    super(status, "The plasma store ran out of memory: " + message);
  }

  /** Plasma's constructor. */
  public PlasmaOutOfMemoryException() {
    super(4, "The plasma store ran out of memory.");
  }
}
