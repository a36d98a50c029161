package io.ferroplasma.plasma.exceptions;

/** An object with this id exists already (create and put of an id that is taken). */
public class DuplicateObjectException extends PlasmaClientException {
  private static final long serialVersionUID = 1L;

  /** The store refused the id (status {@code FP_OBJECT_EXISTS}). */
  public DuplicateObjectException(int status, String message) {
    super(status, message);
  }

  /** Plasma's constructor: the message is the object's id. */
  public DuplicateObjectException(String objectId) {
    super(2, "An object with ID " + objectId + " already exists in the plasma store.");
  }
}
