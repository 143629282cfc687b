-- S7 lists a device's actions sorted by any of seven fields (DESIGN §4).
-- Sorting a device's whole history for each page is too slow (10,000
-- rows: 5-20 ms), so each sort has an index in its order, and a page of 50
-- reads 50 entries.
--
-- The sort indexes hold final device actions only (Completed, Failed,
-- Cancelled), which never change again. So a dispatch writes nothing to
-- them (a million Queued rows cost what they cost before), status reports
-- on actions in flight change nothing in them (on PostgreSQL those updates
-- stay heap-only), and a device action enters them once, when it ends.
-- The few device actions of a device that are not final are found through
-- device_actions_by_device, which now has action_status before action_id:
-- its ranges are exactly the device's Queued (also what redelivery on
-- subscribe reads), Initiated and Progress rows.
--
-- The final statuses are exactly those that sort before 'Initiated'
-- (Cancelled, Completed, Failed < Initiated, Progress, Queued), and the
-- predicates say so: SQLite evaluates a partial index's predicate for
-- every row inserted, and an IN list there cost a dispatch to a million
-- devices five seconds more than a comparison. (sqlstore's tests check the
-- statuses still sort so.)
DROP INDEX device_actions_by_device;
CREATE INDEX device_actions_by_device ON device_actions (tenant, device_id, action_status, action_id);

CREATE INDEX device_actions_final_by_id ON device_actions (tenant, device_id, action_id)
    WHERE action_status < 'Initiated';
CREATE INDEX device_actions_final_by_type ON device_actions (tenant, device_id, type, action_id)
    WHERE action_status < 'Initiated';
CREATE INDEX device_actions_final_by_status ON device_actions (tenant, device_id, status, action_id)
    WHERE action_status < 'Initiated';
CREATE INDEX device_actions_final_by_user_email ON device_actions (tenant, device_id, user_email, action_id)
    WHERE action_status < 'Initiated';
CREATE INDEX device_actions_final_by_user_name ON device_actions (tenant, device_id, user_name, action_id)
    WHERE action_status < 'Initiated';
CREATE INDEX device_actions_final_by_updated_at ON device_actions (tenant, device_id, updated_at, action_id)
    WHERE action_status < 'Initiated';
CREATE INDEX device_actions_final_by_errors ON device_actions (tenant, device_id, error_count, action_id)
    WHERE action_status < 'Initiated';
