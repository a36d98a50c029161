package io.ferroplasma.plasma.exceptions;

/**
 * A call of the store failed. {@link #status()} is the C library's status code ({@code
 * FP_STORE_UNAVAILABLE} = 1, {@code FP_OBJECT_NOT_FOUND} = 3, {@code FP_NOT_HELD} = 9, … as in
 * {@code ferroplasma.h}); the message says what happened and what to do.
 */
public class PlasmaClientException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  /** The C library's status code of the failure. */
  private final int status;

  /** A failure found in Java (a closed client, a bad argument). */
  public PlasmaClientException(String message) {
    this(7, message);
  }

  /** A failure the C library reported with {@code status}. */
  public PlasmaClientException(int status, String message) {
    super(message);
    this.status = status;
  }

  /** The C library's status code ({@code FP_INVALID_ARGUMENT} = 7 for failures found in Java). */
  public int status() {
    return status;
  }
}
